"""The response cache as the SDKs see it: the same call twice is one provider call; the
second answer is the first one, a stream replayed as a stream the SDK reads event by event."""

from __future__ import annotations

import pytest

from support import Sdk, upstreams

CACHED = """
[[routes]]
name = "openai"
path_prefix = "/openai/"
upstream = "plain"
strip_prefix = true
cache = "c"

[[routes]]
name = "anthropic"
path_prefix = "/anthropic/"
upstream = "tls"
strip_prefix = true
cache = "c"

[cache.c]
ttl = "10m"
"""


def streamed_text(sdk: Sdk, stream) -> str:
    parts = []
    for event in stream:
        if sdk.name == "openai":
            if event.choices and event.choices[0].delta.content:
                parts.append(event.choices[0].delta.content)
        elif event.type == "content_block_delta":
            parts.append(event.delta.text)
    return "".join(parts)


@pytest.mark.parametrize("name", ["openai", "anthropic"])
def test_the_same_call_twice_is_one_provider_call(name, start_rebound, fake, fake_tls, openai_client,
                                                  anthropic_client, key):
    r = start_rebound(upstreams(fake, fake_tls) + CACHED)
    sdk = Sdk(name, r, {"plain": fake, "tls": fake_tls}, openai_client, anthropic_client)
    client = sdk.client()
    first = sdk.raw_call(client)
    second = sdk.raw_call(client)
    assert (first.headers.get("x-rebound-cache"), second.headers.get("x-rebound-cache")) == ("miss", "hit")
    assert second.headers.get("age") == "0"
    assert sdk.text(second.parse()) == sdk.text(first.parse())
    assert sdk.provider().count(key) == 1


@pytest.mark.parametrize("name", ["openai", "anthropic"])
def test_a_cached_stream_is_read_as_a_stream(name, start_rebound, fake, fake_tls, openai_client,
                                             anthropic_client, key):
    r = start_rebound(upstreams(fake, fake_tls) + CACHED)
    sdk = Sdk(name, r, {"plain": fake, "tls": fake_tls}, openai_client, anthropic_client)
    client = sdk.client()
    first = sdk.raw_call(client, stream=True)
    text = streamed_text(sdk, first.parse())
    second = sdk.raw_call(client, stream=True)
    assert second.headers.get("x-rebound-cache") == "hit"
    assert second.headers.get("content-type", "").startswith("text/event-stream")
    assert text and streamed_text(sdk, second.parse()) == text
    assert sdk.provider().count(key) == 1
