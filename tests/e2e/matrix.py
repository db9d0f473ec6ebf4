"""The client matrix's shared part (issue 48): one rebound, a route per provider API, and the faults
the scenarios script on the fake providers.

Every route has an `Idempotency-Key` policy, a retry policy of 3 attempts with short delays, and
two targets, the plain fake provider first and the TLS one second, so that a failover shows as
`(plain, tls)` counts of `(1, 1)`:

| route | API | a client's base URL (`base_url`) |
| --- | --- | --- |
| `/m-openai/` | OpenAI | `{url}/m-openai/v1` |
| `/m-anthropic/` | Anthropic (`api = "anthropic"`: a loopback host says nothing) | `{url}/m-anthropic` |
| `/m-gemini/` | Gemini (`api = "gemini"`: the fake serves Gemini's paths, fake_hosts.rs) | `{url}/m-gemini` |

A fault scripted on the plain fake only decides what the app sees:

- `unavailable(api)` for good (`for_good`): 3 attempts on plain (`retries_exhausted` does not move
  a request on these routes: `failover_on` leaves it out, so that a persistent fault reaches the
  app), then the provider's last 503, with `x-should-retry: false`;
- `unavailable(api)` once: rebound's second attempt succeeds (2 calls on plain);
- `overloaded(api)` (529) once: the request moves to tls at once (`overloaded`): counts (1, 1).

The fake provider keys scripts, counts and recorded requests by the `x-fake-key` header: every
client must send the test's key (`key` fixture, conftest.py). A client's credential should be
unique per test too (`credential(key)`), so that no state rebound keeps per credential and body
(the memory of a request that failed for good) links two tests.

Use from a test module:

    from matrix import matrix_rebound  # noqa: F401  (the module-scoped fixture)
    from matrix import PLAIN_MESSAGE, base_url, counts, for_good, overloaded, unavailable
"""

from __future__ import annotations

import json

import pytest

from support import FakeProvider, Rebound, status, upstreams

# A provider's answers, as the fake provider writes them (tests/it/support/fake_provider.rs and
# fake_hosts.rs): the text of a plain call and of a stream (5 deltas).
PLAIN_TEXT = "rebound " * 96
STREAM_TEXT = "".join(f"token{i} " for i in range(5))

# The messages the scripted faults carry: the tests look for them in what the app sees.
UNAVAILABLE_MESSAGE = "The fake provider is unavailable (scripted 503)."
OVERLOADED_MESSAGE = "The fake provider is overloaded (scripted 529)."

APIS = ("openai", "anthropic", "gemini")
ROUTE = {"openai": "m-openai", "anthropic": "m-anthropic", "gemini": "m-gemini"}


def extra_upstreams(fake: FakeProvider, fake_tls: FakeProvider) -> str:
    """The same two fakes once more per API that rebound cannot infer from a loopback host.
    `plain` and `tls` (support.upstreams) speak their route's API: OpenAI's here."""
    out = ""
    for api in ("anthropic", "gemini"):
        for name, p in (("plain", fake), ("tls", fake_tls)):
            ca = f'ca_file = "{p.ca_file}"\n' if p.ca_file else ""
            out += f"""
[upstreams.{api}-{name}]
url = "{p.url}"
{ca}api = "{api}"
connect_timeout = "2s"
cooldown = "off"
"""
    return out


def _route(api: str, first: str, second: str) -> str:
    return f"""
[[routes]]
name = "{ROUTE[api]}"
path_prefix = "/{ROUTE[api]}/"
targets = [{{ upstream = "{first}" }}, {{ upstream = "{second}" }}]
strip_prefix = true
retry = "matrix"
idempotency = "matrix"
# Every reason but retries_exhausted: a 503 for good stays on plain and reaches the app.
failover_on = [
  "circuit_open", "cooldown", "exhausted", "overloaded", "first_byte_timeout", "context_length", "credential",
]
"""


MATRIX_ROUTES = (
    _route("openai", "plain", "tls")
    + _route("anthropic", "anthropic-plain", "anthropic-tls")
    + _route("gemini", "gemini-plain", "gemini-tls")
    + """
[retry.matrix]
max_attempts = 3
base_delay = "10ms"
max_delay = "50ms"
max_retry_after = "10s"
budget_min_per_second = 1000

[idempotency.matrix]
header = "Idempotency-Key"
"""
)


def matrix_config(fake: FakeProvider, fake_tls: FakeProvider) -> str:
    return upstreams(fake, fake_tls, extra_upstreams(fake, fake_tls)) + MATRIX_ROUTES


@pytest.fixture(scope="module")
def matrix_rebound(workdir, fake, fake_tls, request):
    """The matrix's rebound, started once per test module."""
    r = Rebound(workdir / f"rebound-matrix-{request.module.__name__}", matrix_config(fake, fake_tls))
    yield r
    r.stop()


def base_url(rebound: Rebound, api: str) -> str:
    """The base URL a client of `api` is given (the OpenAI SDKs append `/chat/completions`, the
    Anthropic ones `/v1/messages`, google-genai `/v1beta/models/...`)."""
    return f"{rebound.url}/{ROUTE[api]}/v1" if api == "openai" else f"{rebound.url}/{ROUTE[api]}"


def credential(key: str) -> str:
    """A dummy API key unique to the test (rebound keeps some state per credential)."""
    return f"test-key-{key}"


def counts(fake: FakeProvider, fake_tls: FakeProvider, key: str) -> tuple[int, int]:
    """The provider calls the test's key made: (plain, tls)."""
    return fake.count(key), fake_tls.count(key)


def error_body(api: str, code: int, message: str) -> str:
    """A provider's error body in `api`'s shape."""
    if api == "anthropic":
        kind = {529: "overloaded_error", 503: "api_error", 429: "rate_limit_error"}.get(code, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}})
    if api == "gemini":
        name = {503: "UNAVAILABLE", 429: "RESOURCE_EXHAUSTED", 529: "UNAVAILABLE"}.get(code, "INTERNAL")
        return json.dumps({"error": {"code": code, "message": message, "status": name}})
    kind = {429: "rate_limit_error"}.get(code, "server_error")
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


def unavailable(api: str) -> dict:
    """One 503 in `api`'s shape (retried by rebound)."""
    return status(503, {"content-type": "application/json"}, error_body(api, 503, UNAVAILABLE_MESSAGE))


def overloaded(api: str) -> dict:
    """One 529 in `api`'s shape (moves the request to the next target at once)."""
    return status(529, {"content-type": "application/json"}, error_body(api, 529, OVERLOADED_MESSAGE))


def for_good(step: dict, n: int = 30) -> list[dict]:
    """`step` for the next `n` calls: more than any scenario makes (rebound's 3 attempts, plus a
    client's retries), and the script's end would show as a success."""
    return [step] * n


# rebound's own error that every client can provoke on a route (so that it is written in the route's
# API's dialect, docs/errors.md): an `Idempotency-Key` sent again with another body. An unknown
# route prefix (404 `no_route`) is answered before any route matched, in OpenAI's dialect.
OWN_ERROR_STATUS = 422
OWN_ERROR_CODE = "idempotency_key_reused"
OWN_ERROR_MESSAGE = "this idempotency key was already used for a request with a different method, path or body"
