"""Duplicates of an in-flight keyed stream follow the one live generation (`on_concurrent =
"follow"`, the default), through the official SDKs: the provider is called once, every client gets
the same stream as it is produced, and a client that drops mid-stream and retries with its key gets
every event."""

from __future__ import annotations

import threading
import time
import uuid

from support import CHAT, MESSAGE

GAP_MS = 300
CHUNKS = 5
TOKENS = [f"token{i} " for i in range(CHUNKS)]


def test_openai_streams_with_one_key_follow_one_generation(rebound, fake, openai_client, key):
    client = openai_client(f"{rebound.url}/openai/v1")
    headers = {
        "Idempotency-Key": f"follow-{uuid.uuid4()}",
        "x-fake-chunks": str(CHUNKS),
        "x-fake-gap-ms": str(GAP_MS),
    }
    results: dict[int, tuple[list[str], list[float], str | None]] = {}

    def run(i: int) -> None:
        raw = client.chat.completions.with_raw_response.create(**CHAT, stream=True, extra_headers=headers)
        tokens, arrivals = [], []
        for chunk in raw.parse():
            arrivals.append(time.monotonic())
            tokens.append(chunk.choices[0].delta.content)
        results[i] = (tokens, arrivals, raw.headers.get("idempotent-replayed"))

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=30)

    assert len(results) == 4
    assert fake.count(key) == 1, "one generation for four clients"
    assert [r[2] for r in results.values()].count("true") == 3, "three followers"
    for tokens, arrivals, _ in results.values():
        assert tokens == TOKENS
        # Live: every client had its first token before the provider had sent its last one.
        assert arrivals[0] - started < (CHUNKS - 1) * GAP_MS / 1000, arrivals


def test_openai_stream_dropped_mid_way_and_retried_gets_every_event(rebound, fake, openai_client, key):
    client = openai_client(f"{rebound.url}/openai/v1")
    headers = {
        "Idempotency-Key": f"drop-{uuid.uuid4()}",
        "x-fake-chunks": str(CHUNKS),
        "x-fake-gap-ms": str(GAP_MS),
    }
    stream = client.chat.completions.create(**CHAT, stream=True, extra_headers=headers)
    seen = []
    for chunk in stream:
        seen.append(chunk.choices[0].delta.content)
        if len(seen) == 3:
            break
    stream.close()

    again = client.chat.completions.create(**CHAT, stream=True, extra_headers=headers)
    assert [c.choices[0].delta.content for c in again] == TOKENS, "every event, from the first"
    assert seen == TOKENS[:3]
    assert fake.count(key) == 1


def test_anthropic_message_streams_with_one_key_follow_one_generation(rebound, fake, anthropic_client, key):
    client = anthropic_client(f"{rebound.url}/anthropic-plain")
    headers = {
        "Idempotency-Key": f"follow-{uuid.uuid4()}",
        "x-fake-chunks": str(CHUNKS),
        "x-fake-gap-ms": str(GAP_MS),
    }
    texts: dict[int, str] = {}

    def run(i: int) -> None:
        with client.messages.stream(**MESSAGE, extra_headers=headers) as stream:
            texts[i] = "".join(stream.text_stream)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=30)

    assert list(texts.values()) == ["".join(TOKENS)] * 3
    assert fake.count(key) == 1
