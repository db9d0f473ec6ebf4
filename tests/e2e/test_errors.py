"""rebound's own errors as the SDKs raise them: the exception type the app catches, rebound's code
and message readable from it, and no SDK retry on top (`x-should-retry: false`).

The OpenAI SDK reads the body's `error` object: `e.code`, `e.type`. The Anthropic SDK exposes
`e.type` and `e.api_message` (`error.type`, `error.message`); rebound's code is in
`e.body["error"]["code"]`. The shared test config's routes name no `api`, so they speak OpenAI's
dialect even to the Anthropic SDK; the client matrix (test_clients_*.py) drives routes in each
API's own dialect."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest

from support import Sdk, delay, header, status, upstreams


def rebound_error(sdk, e) -> tuple[str, str]:
    """(code, message) of a rebound error, the way the app reads them from this SDK's exception."""
    assert e.type == "rebound_error"
    assert e.response.headers["x-should-retry"] == "false"
    if sdk.name == "openai":
        return e.code, e.body["message"]
    assert e.api_message == e.body["error"]["message"]
    return e.body["error"]["code"], e.api_message


def test_no_route_is_not_found(sdk, key):
    client = sdk.client(prefix="nope")
    with pytest.raises(sdk.module.NotFoundError) as info:
        sdk.call(client)
    e = info.value
    assert e.status_code == 404
    if sdk.name == "openai":
        code, message = rebound_error(sdk, e)
    else:
        # No route, so no route's API: the path (`/v1/messages`) says Anthropic's, and the SDK
        # reads the error as Anthropic's own.
        assert e.type == "not_found_error"
        assert e.response.headers["x-should-retry"] == "false"
        code, message = e.body["error"]["details"]["error_code"], e.api_message
    assert code == "no_route"
    assert e.response.headers["x-rebound-error"] == "no_route"
    assert message.startswith('no route matches "/nope/')
    assert "/openai/" not in message and "/anthropic/" not in message  # the routes are not listed
    # The RFC 9457 side of the same body (in Anthropic's dialect, `type` is Anthropic's).
    body = e.body if sdk.name == "anthropic" else e.response.json()
    assert body["status"] == 404 and body["title"]
    assert body["type"] == "error" if sdk.name == "anthropic" else body["type"].endswith("/no_route")


def test_body_too_large(sdk, key):
    """Over `max_request_body` (64 KiB in the test config): 413, nothing forwarded."""
    client = sdk.client()
    big = "x" * 100_000
    expected = openai.APIStatusError if sdk.name == "openai" else anthropic.ContentTooLargeError
    with pytest.raises(expected) as info:
        if sdk.name == "openai":
            client.chat.completions.create(model="gpt-fake", messages=[{"role": "user", "content": big}])
        else:
            client.messages.create(model="claude-fake", max_tokens=8, messages=[{"role": "user", "content": big}])
    e = info.value
    assert e.status_code == 413
    code, message = rebound_error(sdk, e)
    assert code == "body_too_large"
    assert message
    assert sdk.provider().count(key) == 0


def test_deadline_exceeded(sdk, key):
    """The `short` route: attempts of 300 ms at most, two of them; the provider takes 3 s."""
    provider = sdk.provider("short")
    provider.script(key, [delay(3000)] * 4)
    client = sdk.client(prefix="short")
    expected = openai.InternalServerError if sdk.name == "openai" else anthropic.GatewayTimeoutError
    started = time.monotonic()
    with pytest.raises(expected) as info:
        sdk.call(client)
    elapsed = time.monotonic() - started
    e = info.value
    assert e.status_code == 504
    code, message = rebound_error(sdk, e)
    assert code == "deadline_exceeded"
    assert message
    assert elapsed < 5, elapsed
    # rebound's two attempts, both from the SDK's first try: the SDK did not retry.
    reqs = provider.requests(key)
    assert [header(r, "x-stainless-retry-count") for r in reqs] == ["0", "0"]


CIRCUIT_ROUTES = """
[upstreams.flaky]
url = "{url}"
connect_timeout = "2s"
cooldown = "off"
circuit = "flaky"

[circuit.flaky]
consecutive_failures = 2
open_for = "30s"

[[routes]]
name = "openai"
path_prefix = "/openai/"
upstream = "flaky"
strip_prefix = true

[[routes]]
name = "anthropic"
path_prefix = "/anthropic/"
upstream = "flaky"
strip_prefix = true
"""


@pytest.mark.parametrize("name", ["openai", "anthropic"])
def test_circuit_open(name, start_rebound, fake, fake_tls, openai_client, anthropic_client, key):
    """Two failures in a row open the circuit (30 s): the next call gets 503 `circuit_open` at once,
    with `retry-after`, without reaching the provider, and the SDK does not retry it."""
    r = start_rebound(upstreams(fake, fake_tls) + CIRCUIT_ROUTES.format(url=fake.url))
    sdk = Sdk(name, r, {"plain": fake, "tls": fake_tls}, openai_client, anthropic_client)
    fake.script(key, [status(500)] * 10)

    # Two calls that fail at the provider (the route has no retry policy; one SDK try each).
    once = sdk.client(max_retries=0)
    for _ in range(2):
        with pytest.raises(sdk.module.InternalServerError) as info:
            sdk.call(once)
        assert info.value.status_code == 500
        assert info.value.response.headers.get("x-rebound-error") is None  # the provider's own 500
    assert fake.count(key) == 2

    # The app's next call, SDK defaults (max_retries=2).
    client = sdk.client()
    started = time.monotonic()
    with pytest.raises(sdk.module.APIStatusError) as info:
        sdk.call(client)
    elapsed = time.monotonic() - started
    e = info.value
    assert e.status_code == 503, (
        f"expected 503 circuit_open, got {e.status_code} after {fake.count(key)} provider calls: {e.body}"
    )
    assert isinstance(e, sdk.server_error)
    code, message = rebound_error(sdk, e)
    assert code == "circuit_open"
    assert message
    assert e.response.headers["x-rebound-error"] == "circuit_open"
    assert int(e.response.headers["retry-after"]) > 0
    assert elapsed < 5, elapsed  # an SDK retry would have waited for the retry-after
    assert fake.count(key) == 2
