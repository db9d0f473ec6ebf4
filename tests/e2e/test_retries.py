"""One retry layer: rebound retries, the SDK (left at its defaults, max_retries=2) does not retry on
top; the SDK's timeout caps rebound's deadline; Retry-After hints are honoured by rebound.

The provider records every request with the SDK's `x-stainless-retry-count`: attempts that all
carry "0" came from one SDK call, retried by rebound alone."""

from __future__ import annotations

import time

import anthropic
import pytest

from support import MESSAGE, delay, header, in_band_error, status

TIMEOUT_HEADERS = ("x-stainless-timeout", "x-stainless-read-timeout")


def retry_counts(provider, key) -> list[str | None]:
    return [header(r, "x-stainless-retry-count") for r in provider.requests(key)]


def test_permanent_503_is_tried_three_times_not_nine(sdk, key):
    """max_attempts = 3 at rebound, max_retries = 2 in the SDK: 3 attempts at the provider, not 3 x 3."""
    provider = sdk.provider()
    provider.script(key, [status(503)] * 20)
    client = sdk.client()  # SDK defaults: max_retries=2
    with pytest.raises(sdk.server_error) as info:
        sdk.call(client)
    e = info.value
    assert e.status_code == 503
    assert e.response.headers["x-rebound-attempts"] == "3"
    assert e.response.headers["x-should-retry"] == "false"
    # The provider's own 503 body comes through untouched.
    assert "scripted 503" in str(e.body)
    time.sleep(0.5)  # anything late would show up now
    assert provider.count(key) == 3
    assert retry_counts(provider, key) == ["0", "0", "0"]


def test_retry_after_ms_is_honoured_by_rebound(sdk, key):
    """A 429 with `retry-after-ms: 300`: rebound waits and retries, the app sees a success."""
    provider = sdk.provider()
    provider.script(key, [status(429, {"retry-after-ms": "300"})])
    client = sdk.client()
    started = time.monotonic()
    raw = sdk.raw_call(client)
    elapsed = time.monotonic() - started
    assert raw.status_code == 200
    assert sdk.text(raw.parse()).startswith("rebound")
    assert raw.headers["x-rebound-attempts"] == "2"
    assert elapsed >= 0.3, elapsed  # the hint was waited for
    assert provider.count(key) == 2
    assert retry_counts(provider, key) == ["0", "0"]  # both from the SDK's first try


def test_retry_after_over_max_reaches_the_app_at_once(sdk, key):
    """A 429 whose hint (60 s) exceeds `max_retry_after` (10 s): back to the app at once, as the
    SDK's RateLimitError, with the hint intact, and the SDK does not wait 60 s to retry it."""
    provider = sdk.provider()
    provider.script(key, [status(429, {"retry-after": "60"})] * 5)
    client = sdk.client()
    started = time.monotonic()
    with pytest.raises(sdk.module.RateLimitError) as info:
        sdk.call(client)
    elapsed = time.monotonic() - started
    e = info.value
    assert elapsed < 1.5, elapsed
    assert e.status_code == 429
    assert e.response.headers["retry-after"] == "60"
    assert e.response.headers["x-should-retry"] == "false"
    assert e.response.headers["x-rebound-attempts"] == "1"
    assert provider.count(key) == 1


def test_what_the_sdk_sends_as_its_timeout(sdk, key):
    """Straight to the provider (no rebound): which timeout header this SDK version sends, in seconds.
    OpenAI: `x-stainless-read-timeout` only. Anthropic: both, and `x-stainless-timeout` is the literal
    "NOT_GIVEN" when the timeout is set on the client rather than on the call (rebound ignores a value
    it cannot parse and uses the other)."""
    provider = sdk.fakes["plain"]
    client = sdk.direct_client(provider, timeout=7.5)
    sdk.call(client)
    sdk.call(client, timeout=3.0)
    sent = [{h: header(r, h) for h in TIMEOUT_HEADERS} for r in provider.requests(key)]
    print(f"\n{sdk.name} sends: client timeout 7.5 -> {sent[0]}; call timeout 3.0 -> {sent[1]}")
    if sdk.name == "openai":
        assert sent == [
            {"x-stainless-timeout": None, "x-stainless-read-timeout": "7.5"},
            {"x-stainless-timeout": None, "x-stainless-read-timeout": "3.0"},
        ]
    else:
        assert sent == [
            {"x-stainless-timeout": "NOT_GIVEN", "x-stainless-read-timeout": "7.5"},
            {"x-stainless-timeout": "3.0", "x-stainless-read-timeout": "3.0"},
        ]


def test_request_limit_headers(sdk, key):
    """rebound's own request headers are read and not forwarded; the SDK's headers reach the
    provider as the SDK sent them (rebound reads its timeout, it does not take it away)."""
    sdk.call(sdk.client(timeout=7.5), extra_headers={"x-rebound-max-attempts": "2", "x-rebound-deadline-ms": "9000"})
    [req] = sdk.provider().requests(key)
    assert header(req, "x-rebound-max-attempts") is None
    assert header(req, "x-rebound-deadline-ms") is None
    assert header(req, "x-stainless-read-timeout") == "7.5"
    assert header(req, "x-stainless-retry-count") == "0"


def test_sdk_timeout_caps_a_retry_after_wait(sdk, key):
    """SDK timeout 2 s, a 503 asking for 4 s (within max_retry_after): rebound does not start a wait
    that would outlive the SDK. The 503 reaches the app at once, the SDK does not retry it, and the
    provider never sees a second attempt."""
    provider = sdk.provider()
    provider.script(key, [status(503, {"retry-after-ms": "4000"})])
    client = sdk.client(timeout=2.0)
    started = time.monotonic()
    with pytest.raises(sdk.server_error) as info:
        sdk.call(client)
    elapsed = time.monotonic() - started
    e = info.value
    assert e.status_code == 503
    assert e.response.headers["x-should-retry"] == "false"
    assert e.response.headers["x-rebound-attempts"] == "1"
    assert elapsed < 1.5, elapsed
    time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))  # past the 4 s hint
    assert provider.count(key) == 1


def test_rebound_stops_when_the_sdk_gives_up(sdk, key):
    """The `pertry` route allows 3 attempts of 1.5 s; the provider takes 3 s each. With the SDK's
    timeout at 1 s, rebound makes one attempt per SDK try and none after the SDK gave up: without
    the cap, each SDK try would cost three attempts, spread over ~3 s. (Two things stop rebound
    here: the deadline it took from the SDK's timeout header, and the SDK closing the connection,
    which drops the request. test_sdk_timeout_caps_a_retry_after_wait isolates the header.)"""
    provider = sdk.provider("pertry")
    provider.script(key, [delay(3000)] * 10)
    client = sdk.client(prefix="pertry", timeout=1.0)
    with pytest.raises((sdk.module.APITimeoutError, sdk.module.InternalServerError)) as info:
        sdk.call(client)
    if isinstance(info.value, sdk.module.APIStatusError):
        # rebound's 504 raced the SDK's own timer and won: the SDK stops there.
        assert info.value.status_code == 504
    time.sleep(4.0)  # rebound's would-be retries of the last try: 1.5 s + 1.5 s + waits
    counts = retry_counts(provider, key)
    print(f"\n{sdk.name}: {type(info.value).__name__} after the SDK's tries {counts}")
    assert 1 <= len(counts) <= 3, counts
    # One attempt per SDK try: no try of the SDK was retried by rebound after the SDK gave up on it.
    assert len(set(counts)) == len(counts), counts


def test_anthropic_stream_is_clean_after_an_in_band_overloaded_error(rebound, fake, anthropic_client, key):
    """Anthropic answers 200 and reports `overloaded_error` as the stream's first event. Straight
    to the provider the SDK's `messages.stream` raises; through rebound (529 is in the route's
    `retry_on`) the first event is classified before anything is forwarded, the request is retried,
    and the app reads one clean stream."""
    fake.script(key, [in_band_error("overloaded_error")])
    direct = anthropic_client(fake.url, max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        with direct.messages.stream(**MESSAGE) as stream:
            list(stream.text_stream)
    assert fake.count(key) == 1

    fake.script(key, [in_band_error("overloaded_error")])
    client = anthropic_client(f"{rebound.url}/anthropic-plain")
    with client.messages.stream(**MESSAGE) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == [f"token{i} " for i in range(5)]
    assert final.stop_reason == "end_turn"
    assert fake.count(key) == 3  # the direct call, then rebound's two attempts
    assert retry_counts(fake, key)[1:] == ["0", "0"]  # one SDK call, retried by rebound
