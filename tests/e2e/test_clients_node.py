"""The client matrix's Node half (issue 48): the OpenAI and Anthropic TypeScript SDKs and the Vercel
AI SDK with its OpenAI and Anthropic providers, pinned in tests/clients (package-lock.json), each
made as an app makes it (a base URL, a dummy key, the library's default retries) and driven by
tests/clients/matrix.mjs through the matrix's rebound (matrix.py: a route per API, two targets,
3 attempts, an Idempotency-Key policy) and the fake providers.

Each scenario asserts what the app sees (the text, or the exception's type, status and message)
and the provider calls made, counted as (plain fake, TLS fake):

| scenario | the app sees | provider calls |
| --- | --- | --- |
| a call, a stream | the fake's text | (1, 0) |
| one 503, then success | the text | (2, 0): rebound retried, the client did not |
| a 503 for good | the client's exception, the provider's message | 3 + the client's own retries |
| an Idempotency-Key sent again with another body | rebound's 422 `idempotency_key_reused`, in its words | (1, 0) |
| an unknown route prefix | rebound's 404 `no_route`, in its words | (0, 0) |
| the same Idempotency-Key twice | the same text twice, the second `idempotent-replayed` | (1, 0) |
| a 529 on the first target | the text, from the second target | (1, 1) |

The OpenAI and Anthropic SDKs obey `x-should-retry: false` (no retry on top of rebound's); the AI
SDK (`ai` 6.0.333) ignores it and retries any 408, 409, 429 or 5xx twice (`maxRetries` 2), after
2 s then 4 s, or after the response's `retry-after-ms` (milliseconds), else `retry-after` (seconds
or an HTTP date), when that is under 60 s (ai/dist: `getRetryDelayInMs`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from matrix import (  # noqa: F401  (matrix_rebound is a fixture)
    OWN_ERROR_CODE,
    OWN_ERROR_STATUS,
    PLAIN_TEXT,
    ROUTE,
    STREAM_TEXT,
    UNAVAILABLE_MESSAGE,
    base_url,
    counts,
    credential,
    for_good,
    matrix_rebound,
    overloaded,
    unavailable,
)
from support import ROOT, header

CLIENTS_DIR = ROOT / "tests/clients"
RUNNER = CLIENTS_DIR / "matrix.mjs"
# A run is at most two calls; the AI SDK's retries wait 2 s + 4 s. Generous on a loaded machine.
NODE_TIMEOUT = 120

# rebound's words, as docs/errors.md gives them.
REUSED_MESSAGE = (
    "this idempotency key was already used for a request with a different method, path or body; "
    "use a new key for a new request"
)
NO_ROUTE_MESSAGE = (
    "a path must start with one of this sidecar's route prefixes (its operator's `rebound check` lists them)"
)


@dataclass(frozen=True)
class Client:
    name: str  # matrix.mjs's CLIENT
    api: str  # the route's API (matrix.py)
    # The base URL's tail after the route prefix: the AI SDK's Anthropic provider wants `/v1`
    # (its default is https://api.anthropic.com/v1), the Anthropic SDK appends `/v1/messages`.
    tail: str
    # The provider's path the client calls.
    path: str
    # The request header carrying the client's API key, and its value for `credential(key)`.
    credential_header: str
    credential_prefix: str
    # The client's own retries of a final 503 from rebound.
    retries_on_top: int
    # Whether it is one of the official SDKs (Stainless: `x-stainless-retry-count`, exception
    # class per status, message "STATUS <provider's message>") or the AI SDK (APICallError, the
    # provider's message alone; RetryError after its retries).
    official: bool
    # The official SDK's exception class per status.
    classes: dict[int, str]

    def url(self, rebound, prefix: str | None = None) -> str:
        u = base_url(rebound, self.api)
        if prefix is not None:  # the same URL under another route prefix
            u = u.replace(f"{rebound.url}/{ROUTE[self.api]}", f"{rebound.url}/{prefix}", 1)
        return u + self.tail


OPENAI_CLASSES = {404: "NotFoundError", 422: "UnprocessableEntityError", 503: "InternalServerError"}
ANTHROPIC_CLASSES = {404: "NotFoundError", 422: "UnprocessableEntityError", 503: "ServiceUnavailableError"}

CLIENTS = {
    c.name: c
    for c in (
        Client("openai", "openai", "", "/v1/chat/completions", "authorization", "Bearer ", 0, True, OPENAI_CLASSES),
        # @anthropic-ai/sdk 1.x sends the key as a bearer token, not as x-api-key (docs/clients.md).
        Client("anthropic", "anthropic", "", "/v1/messages", "authorization", "Bearer ", 0, True, ANTHROPIC_CLASSES),
        # The AI SDK's default OpenAI model is the Responses API.
        Client("ai-openai", "openai", "", "/v1/responses", "authorization", "Bearer ", 2, False, {}),
        Client("ai-anthropic", "anthropic", "/v1", "/v1/messages", "x-api-key", "", 2, False, {}),
    )
}
NAMES = list(CLIENTS)


@pytest.fixture(scope="module")
def node() -> str:
    node = shutil.which("node")
    if node is None or not (CLIENTS_DIR / "node_modules/ai").is_dir():
        pytest.fail("node and tests/clients/node_modules are needed: npm ci --prefix tests/clients (scripts/test does)")
    return node


@pytest.fixture(params=NAMES)
def client(request) -> Client:
    return CLIENTS[request.param]


def run(node: str, client: Client, action: str, url: str, key: str) -> list[dict]:
    """matrix.mjs's calls, each {"ok": true, "text", "headers"} or {"ok": false, "error"}."""
    proc = subprocess.run(
        [node, str(RUNNER), client.name, action, url, key, credential(key)],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["client"], out["action"]) == (client.name, action)
    return out["calls"]


def ok(result: dict) -> dict:
    assert result["ok"], json.dumps(result["error"], indent=1)[:4000]
    return result


def failed(result: dict) -> dict:
    assert not result["ok"], result
    return result["error"]


def assert_status_error(client: Client, error: dict, status: int, message: str) -> None:
    """The exception an official SDK or the AI SDK raises for one error response (no retry):
    its class, the status, and the message carrying `message`."""
    assert error["status"] == status, error
    if client.official:
        assert error["constructor"] == client.classes[status], error
        assert error["message"].startswith(f"{status} {message}"), error["message"]
    else:
        assert (error["constructor"], error["name"]) == ("APICallError", "AI_APICallError"), error
        assert error["message"] == message, error["message"]


def test_a_plain_call_returns_the_text_and_sends_the_apps_key(node, client, matrix_rebound, fake, fake_tls, key):
    (result,) = run(node, client, "call", client.url(matrix_rebound), key)
    assert ok(result)["text"] == PLAIN_TEXT
    assert result["headers"]["x-rebound-attempts"] == "1"
    assert counts(fake, fake_tls, key) == (1, 0)
    (seen,) = fake.requests(key)
    assert seen["path"] == client.path
    assert header(seen, client.credential_header) == client.credential_prefix + credential(key)
    # Only the one credential header: rebound's set_headers must replace that one (docs/clients.md).
    other = "x-api-key" if client.credential_header == "authorization" else "authorization"
    assert header(seen, other) is None


def test_a_stream_returns_the_streamed_text(node, client, matrix_rebound, fake, fake_tls, key):
    (result,) = run(node, client, "stream", client.url(matrix_rebound), key)
    assert ok(result)["text"] == STREAM_TEXT
    assert counts(fake, fake_tls, key) == (1, 0)
    (seen,) = fake.requests(key)
    assert json.loads(bytes(seen["body"]))["stream"] is True


def test_one_503_is_retried_by_rebound_not_by_the_client(node, client, matrix_rebound, fake, fake_tls, key):
    fake.script(key, [unavailable(client.api)])
    (result,) = run(node, client, "call", client.url(matrix_rebound), key)
    assert ok(result)["text"] == PLAIN_TEXT
    assert result["headers"]["x-rebound-attempts"] == "2"
    assert counts(fake, fake_tls, key) == (2, 0)
    if client.official:  # both attempts carry the SDK's first try
        assert [header(q, "x-stainless-retry-count") for q in fake.requests(key)] == ["0", "0"]


def test_a_503_for_good_costs_rebounds_attempts_plus_the_clients_retries(
    node, client, matrix_rebound, fake, fake_tls, key
):
    """rebound makes its 3 attempts and hands the provider's last 503 back with
    `x-should-retry: false`. The official SDKs stop there: 3 calls. The AI SDK retries twice
    (2 s, then 4 s later); each retry repeats a request that failed for good moments ago, which
    rebound tries once (issue 48 item 2): 3 + 2 = 5 calls, not 3 x 3."""
    fake.script(key, for_good(unavailable(client.api)))
    (result,) = run(node, client, "call", client.url(matrix_rebound), key)
    error = failed(result)
    if client.official:
        assert_status_error(client, error, 503, UNAVAILABLE_MESSAGE)
        assert error["headers"]["x-should-retry"] == "false"
        assert error["headers"]["x-rebound-attempts"] == "3"
        assert [header(q, "x-stainless-retry-count") for q in fake.requests(key)] == ["0"] * 3
    else:
        assert (error["constructor"], error["name"], error["reason"]) == (
            "RetryError",
            "AI_RetryError",
            "maxRetriesExceeded",
        ), error
        assert error["message"] == f"Failed after 3 attempts. Last error: {UNAVAILABLE_MESSAGE}"
        assert len(error["errors"]) == 1 + client.retries_on_top
        for attempt in error["errors"]:
            assert_status_error(client, attempt, 503, UNAVAILABLE_MESSAGE)
            assert attempt["headers"]["x-should-retry"] == "false"
    assert counts(fake, fake_tls, key) == (3 + client.retries_on_top, 0)
    if not client.official:
        # rebound's first answer after its 3 attempts; the repeats, one attempt each.
        assert [e["headers"]["x-rebound-attempts"] for e in error["errors"]] == ["3"] + ["1"] * client.retries_on_top


def test_rebounds_own_error_reaches_the_app_in_its_words(node, client, matrix_rebound, fake, fake_tls, key):
    """An Idempotency-Key sent again with another body: rebound's 422, in the route's API's dialect,
    so that every client's message is rebound's text (not "Unprocessable Entity")."""
    first, second = run(node, client, "reuse", client.url(matrix_rebound), key)
    assert ok(first)["text"] == PLAIN_TEXT
    error = failed(second)
    assert_status_error(client, error, OWN_ERROR_STATUS, REUSED_MESSAGE)
    assert error["headers"]["x-rebound-error"] == OWN_ERROR_CODE
    assert error["headers"]["x-should-retry"] == "false"
    if client.name == "openai":
        assert (error["type"], error["code"]) == ("rebound_error", OWN_ERROR_CODE)
    if client.name == "anthropic":
        # Anthropic's error type for the status, rebound's code in error.details.error_code.
        assert error["type"] == "invalid_request_error"
        assert error["body"]["error"]["details"]["error_code"] == OWN_ERROR_CODE
    assert counts(fake, fake_tls, key) == (1, 0)


def test_no_route_reaches_the_app_in_rebounds_words(node, client, matrix_rebound, fake, fake_tls, key):
    """No route, so no route's API: the path tells which API the client speaks (before, the
    OpenAI-shaped body left @ai-sdk/anthropic showing only "Not Found")."""
    (result,) = run(node, client, "call", client.url(matrix_rebound, prefix="no-such-route"), key)
    error = failed(result)
    assert error["headers"]["x-rebound-error"] == "no_route"
    message = f'no route matches "/no-such-route{client.path}": {NO_ROUTE_MESSAGE}'
    assert_status_error(client, error, 404, message)
    assert counts(fake, fake_tls, key) == (0, 0)


def test_an_idempotency_key_sent_twice_is_answered_once(node, client, matrix_rebound, fake, fake_tls, key):
    first, second = run(node, client, "replay", client.url(matrix_rebound), key)
    assert ok(first)["text"] == ok(second)["text"] == PLAIN_TEXT
    assert "idempotent-replayed" not in first["headers"]
    assert second["headers"]["idempotent-replayed"] == "true"
    assert second["headers"]["x-rebound-attempts"] == "0"
    assert counts(fake, fake_tls, key) == (1, 0)
    (seen,) = fake.requests(key)
    assert header(seen, "idempotency-key") == f"{key}-idem"


def test_an_overloaded_first_target_is_failed_over(node, client, matrix_rebound, fake, fake_tls, key):
    fake.script(key, [overloaded(client.api)])
    (result,) = run(node, client, "call", client.url(matrix_rebound), key)
    assert ok(result)["text"] == PLAIN_TEXT
    assert result["headers"]["x-rebound-failovers"] == "1"
    assert result["headers"]["x-rebound-upstream"] == ("tls" if client.api == "openai" else "anthropic-tls")
    assert counts(fake, fake_tls, key) == (1, 1)
