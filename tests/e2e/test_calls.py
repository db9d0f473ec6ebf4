"""The ordinary calls an app makes, through rebound, over a plain and a TLS upstream: JSON,
streaming (chunk by chunk, not buffered), and Idempotency-Key replays."""

from __future__ import annotations

import time
import uuid

import pytest

from support import CHAT, MESSAGE, header

GAP_MS = 300
CHUNKS = 5
TOKENS = [f"token{i} " for i in range(CHUNKS)]
STREAM_HEADERS = {"x-fake-gap-ms": str(GAP_MS), "x-fake-chunks": str(CHUNKS)}


def assert_incremental(started: float, arrivals: list[float]) -> None:
    """The provider sends chunk i no earlier than i * GAP after the request: the last one at least
    (CHUNKS - 1) * GAP after it. A buffered stream would deliver them all at once, after the last."""
    gap = GAP_MS / 1000
    assert arrivals == sorted(arrivals)
    # The first chunk reached the app before the provider had even sent the last.
    assert arrivals[0] - started < (CHUNKS - 1) * gap, arrivals
    # And they came spread out as the provider sent them.
    assert arrivals[-1] - arrivals[0] >= (CHUNKS - 1) * gap / 2, arrivals


@pytest.mark.parametrize("prefix", ["openai", "openai-tls"])
def test_openai_chat_completion(rebound, fake, fake_tls, openai_client, key, prefix):
    client = openai_client(f"{rebound.url}/{prefix}/v1")
    raw = client.chat.completions.with_raw_response.create(**CHAT)
    completion = raw.parse()

    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content.startswith("rebound rebound")
    assert completion.usage.total_tokens == 108
    assert raw.headers["x-rebound-attempts"] == "1"
    assert raw.headers["x-request-id"] == "req_fake_0001"

    provider = fake if prefix == "openai" else fake_tls
    [req] = provider.requests(key)
    assert (req["method"], req["path"]) == ("POST", "/v1/chat/completions")
    assert header(req, "authorization") == f"Bearer sk-test-{key}"
    # rebound speaks HTTP/2 to the TLS upstream (ALPN), HTTP/1.1 to the plain one.
    assert req["version"] == ("HTTP/1.1" if prefix == "openai" else "HTTP/2.0")


@pytest.mark.parametrize("prefix", ["openai", "openai-tls"])
def test_openai_chat_stream_is_incremental(rebound, fake, fake_tls, openai_client, key, prefix):
    client = openai_client(f"{rebound.url}/{prefix}/v1")
    started = time.monotonic()
    stream = client.chat.completions.create(**CHAT, stream=True, extra_headers=STREAM_HEADERS)
    arrivals, texts = [], []
    for chunk in stream:
        arrivals.append(time.monotonic())
        texts.append(chunk.choices[0].delta.content)

    assert texts == TOKENS
    assert_incremental(started, arrivals)
    assert (fake if prefix == "openai" else fake_tls).count(key) == 1


@pytest.mark.parametrize("prefix", ["anthropic", "anthropic-plain"])
def test_anthropic_message(rebound, fake, fake_tls, anthropic_client, key, prefix):
    client = anthropic_client(f"{rebound.url}/{prefix}")
    raw = client.messages.with_raw_response.create(**MESSAGE)
    message = raw.parse()

    assert message.type == "message"
    assert message.content[0].text.startswith("rebound rebound")
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 96
    assert raw.headers["x-rebound-attempts"] == "1"

    provider = fake_tls if prefix == "anthropic" else fake
    [req] = provider.requests(key)
    assert (req["method"], req["path"]) == ("POST", "/v1/messages")
    # anthropic 2.x sends its API key as a bearer token (not x-api-key).
    assert header(req, "authorization") == f"Bearer sk-ant-test-{key}"
    assert header(req, "anthropic-version")


@pytest.mark.parametrize("prefix", ["anthropic", "anthropic-plain"])
def test_anthropic_stream_helper_is_incremental(rebound, anthropic_client, key, prefix):
    """`client.messages.stream(...)`, the helper that accumulates the message from the events."""
    client = anthropic_client(f"{rebound.url}/{prefix}")
    started = time.monotonic()
    arrivals, texts = [], []
    with client.messages.stream(**MESSAGE, extra_headers=STREAM_HEADERS) as stream:
        for text in stream.text_stream:
            arrivals.append(time.monotonic())
            texts.append(text)
        final = stream.get_final_message()

    assert texts == TOKENS
    assert_incremental(started, arrivals)
    assert final.content[0].text == "".join(TOKENS)
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == CHUNKS


def test_anthropic_raw_stream_events(rebound, anthropic_client, key):
    """`messages.create(stream=True)`: the raw events, in the order the API documents."""
    client = anthropic_client(f"{rebound.url}/anthropic")
    events = [e.type for e in client.messages.create(**MESSAGE, stream=True, extra_headers={"x-fake-chunks": "3"})]
    assert events == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_idempotency_key_replayed(sdk, key):
    """The same Idempotency-Key twice: one provider call, the second answer replayed."""
    client = sdk.client()
    headers = {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    first = sdk.raw_call(client, extra_headers=headers)
    second = sdk.raw_call(client, extra_headers=headers)

    assert sdk.provider().count(key) == 1
    assert first.headers.get("idempotent-replayed") is None
    assert first.headers["x-rebound-attempts"] == "1"
    assert second.headers["idempotent-replayed"] == "true"
    assert second.headers["x-rebound-attempts"] == "0"
    assert second.status_code == 200
    assert sdk.text(second.parse()) == sdk.text(first.parse())
    assert second.parse().id == first.parse().id
    # The key is still forwarded, for providers that honour it themselves.
    [req] = sdk.provider().requests(key)
    assert header(req, "idempotency-key") == headers["Idempotency-Key"]

    # Another key is another request.
    sdk.raw_call(client, extra_headers={"Idempotency-Key": f"order-{uuid.uuid4()}"})
    assert sdk.provider().count(key) == 2


def test_idempotency_key_replays_a_stream(rebound, fake, openai_client, key):
    client = openai_client(f"{rebound.url}/openai/v1")
    headers = {"Idempotency-Key": f"stream-{uuid.uuid4()}", "x-fake-chunks": "4"}

    def run():
        stream = client.chat.completions.create(**CHAT, stream=True, extra_headers=headers)
        return [c.choices[0].delta.content for c in stream]

    first = run()
    raw = client.chat.completions.with_raw_response.create(**CHAT, stream=True, extra_headers=headers)
    assert raw.headers["idempotent-replayed"] == "true"
    second = [c.choices[0].delta.content for c in raw.parse()]
    assert first == second == TOKENS[:4]
    assert fake.count(key) == 1
