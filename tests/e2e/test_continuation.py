"""Mid-stream continuation as the official SDKs read it: a stream cut after its first events (an
`overloaded_error` event, a reset) on a route with `continue_streams` is parsed by the Anthropic
and OpenAI Python SDKs into one message whose text is the whole answer."""

from __future__ import annotations

import anthropic
import openai
import pytest

from support import mid_stream_error, status, upstreams

CHUNKS = 8
WHOLE = "".join(f"token{i} " for i in range(CHUNKS))

ROUTE = """
[[routes]]
name = "cont"
path_prefix = "/cont/"
upstream = "plain"
strip_prefix = true
continue_streams = true
"""


def base_url(r, fake, fake_tls, start_rebound) -> str:
    return start_rebound(upstreams(fake, fake_tls) + ROUTE).url + "/cont"


def test_the_anthropic_sdk_reads_one_whole_message(fake, fake_tls, start_rebound, anthropic_client, key):
    fake.script(key, [mid_stream_error(3, "overloaded_error")])
    client = anthropic_client(base_url(None, fake, fake_tls, start_rebound), max_retries=0)
    with client.messages.stream(
        model="claude-fake",
        max_tokens=100,
        messages=[{"role": "user", "content": "count"}],
        extra_headers={"x-fake-chunks": str(CHUNKS)},
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == WHOLE
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == WHOLE
    assert message.stop_reason == "end_turn"
    # Both attempts' input, and every output token.
    assert message.usage.input_tokens == 24
    assert fake.count(key) == 2


def test_the_openai_sdk_reads_one_whole_completion(fake, fake_tls, start_rebound, openai_client, key):
    fake.script(key, [{"kind": "cut_after_first_chunk"}])
    client: openai.OpenAI = openai_client(base_url(None, fake, fake_tls, start_rebound), max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="gpt-fake",
            messages=[{"role": "user", "content": "count"}],
            stream=True,
            extra_headers={"x-fake-chunks": str(CHUNKS)},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == WHOLE
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert fake.count(key) == 2


# A stream that cannot be finished ends with an error event in its dialect, and the SDKs raise
# it: the provider's own when it cut the stream with one, else rebound's `stream_cut`.


def test_the_anthropic_sdk_raises_the_providers_error_when_a_stream_cannot_be_finished(
    fake, fake_tls, start_rebound, anthropic_client, key
):
    fake.script(key, [mid_stream_error(3, "overloaded_error"), status(400)])
    client = anthropic_client(base_url(None, fake, fake_tls, start_rebound), max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        with client.messages.stream(
            model="claude-fake",
            max_tokens=100,
            messages=[{"role": "user", "content": "count"}],
            extra_headers={"x-fake-chunks": str(CHUNKS)},
        ) as stream:
            for _ in stream.text_stream:
                pass
    assert raised.value.body["error"]["type"] == "overloaded_error"
    assert fake.count(key) == 2


def test_the_anthropic_sdk_raises_stream_cut_after_a_reset_that_cannot_be_finished(
    fake, fake_tls, start_rebound, anthropic_client, key
):
    fake.script(key, [{"kind": "cut_after_first_chunk"}, status(400)])
    client = anthropic_client(base_url(None, fake, fake_tls, start_rebound), max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        with client.messages.stream(
            model="claude-fake",
            max_tokens=100,
            messages=[{"role": "user", "content": "count"}],
            extra_headers={"x-fake-chunks": str(CHUNKS)},
        ) as stream:
            for _ in stream.text_stream:
                pass
    error = raised.value.body["error"]
    assert error["type"] == "stream_cut"
    assert "could not be finished" in error["message"], error


def test_the_openai_sdk_raises_stream_cut_on_chat_and_responses(
    fake, fake_tls, start_rebound, openai_client, key
):
    client: openai.OpenAI = openai_client(base_url(None, fake, fake_tls, start_rebound), max_retries=0)
    fake.script(key, [{"kind": "cut_after_first_chunk"}, status(400)])
    with pytest.raises(openai.APIError) as raised:
        for _ in client.chat.completions.create(
            model="gpt-fake",
            messages=[{"role": "user", "content": "count"}],
            stream=True,
            extra_headers={"x-fake-chunks": str(CHUNKS)},
        ):
            pass
    assert raised.value.code == "stream_cut"
    assert "answered 400" in raised.value.message

    responses_key = key + "-responses"
    fake.script(responses_key, [{"kind": "cut_after_first_chunk"}, status(400)])
    with pytest.raises(openai.APIError) as raised:
        for _ in client.responses.create(
            model="gpt-fake",
            input="count",
            stream=True,
            extra_headers={"x-fake-chunks": str(CHUNKS), "x-fake-key": responses_key},
        ):
            pass
    assert raised.value.code == "stream_cut"
