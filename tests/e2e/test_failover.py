"""Capacity routing as the SDKs see it: a route over two targets (the plain and the TLS
fake provider). The first target answers a 529 overloaded, a 429 or a quota used up; the SDK's one
call is served by the second target, says so in its headers, and the SDK does not retry on top."""

from __future__ import annotations

import pytest

from support import Sdk, header, status, upstreams

TWO_TARGETS = """
[[routes]]
name = "openai"
path_prefix = "/openai/"
targets = [{ upstream = "plain" }, { upstream = "tls" }]
strip_prefix = true
retry = "llm"

[[routes]]
name = "anthropic"
path_prefix = "/anthropic/"
targets = [{ upstream = "plain" }, { upstream = "tls" }]
strip_prefix = true
retry = "llm"

[retry.llm]
max_attempts = 3
base_delay = "10ms"
max_delay = "50ms"
"""

QUOTA = (
    '{"error":{"message":"You exceeded your current quota","type":"insufficient_quota",'
    '"param":null,"code":"insufficient_quota"}}'
)


@pytest.mark.parametrize("name", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "first",
    [
        status(529),
        status(429, {"retry-after": "2"}),
        status(429, {"content-type": "application/json"}, QUOTA),
    ],
    ids=["overloaded", "rate-limited", "quota-used-up"],
)
def test_one_sdk_call_is_served_by_the_next_target(
    name, first, start_rebound, fake, fake_tls, openai_client, anthropic_client, key
):
    r = start_rebound(upstreams(fake, fake_tls) + TWO_TARGETS)
    sdk = Sdk(name, r, {"plain": fake, "tls": fake_tls}, openai_client, anthropic_client)
    fake.script(key, [first])
    raw = sdk.raw_call(sdk.client())  # SDK defaults: max_retries=2
    assert raw.headers.get("x-rebound-upstream") == "tls"
    assert raw.headers.get("x-rebound-failovers") == "1"
    assert raw.headers.get("x-rebound-attempts") == "2"
    assert sdk.text(raw.parse())
    assert (fake.count(key), fake_tls.count(key)) == (1, 1)
    # One SDK call: both attempts carry the SDK's first try.
    reqs = fake.requests(key) + fake_tls.requests(key)
    assert [header(q, "x-stainless-retry-count") for q in reqs] == ["0", "0"]
