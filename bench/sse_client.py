#!/usr/bin/env python3
"""Concurrent SSE streaming client for the rebound benchmark (stdlib only).

Opens N connections, then starts N `POST {"stream":true}` requests at once (raw HTTP/1.1 over
asyncio streams, one request per connection) and reads every stream to its end. Repeats for
`--rounds` rounds (each round is N concurrent streams; rounds run one after another).

For each stream it records, relative to the moment the request is written:
  head_ms   time until the response head (status line and headers) has arrived;
  ttfb_ms   time until the first SSE event (first `data:` event of the body) has arrived;
  total_ms  time until the end of the body (chunked terminator, Content-Length, or EOF).
A stream is complete when the status is 2xx, exactly `events` data events followed by
`data: [DONE]` arrived, and the body ended cleanly. Everything is bounded: connect, each stream
and each round have timeouts.

Prints one JSON object on stdout (see `summary()`); exit status is 0 unless the arguments are bad.
"""

import argparse
import asyncio
import json
import math
import resource
import sys
import time
from urllib.parse import urlsplit


def percentile(values, p):
    """Nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


class StreamResult:
    __slots__ = ("status", "head_ms", "ttfb_ms", "total_ms", "events", "done", "clean_end", "error", "t_start", "t_end")

    def __init__(self):
        self.t_start = None  # perf_counter() when the request was written, and when the stream ended
        self.t_end = None
        self.status = None
        self.head_ms = None
        self.ttfb_ms = None
        self.total_ms = None
        self.events = 0
        self.done = False
        self.clean_end = False
        self.error = None

    def complete(self, expected_events):
        return (
            self.error is None
            and self.status is not None
            and 200 <= self.status < 300
            and self.done
            and self.events == expected_events
            and self.clean_end
        )


class SseParser:
    """Splits a byte stream into SSE events (blank-line separated) and counts `data:` events."""

    def __init__(self, result, t0):
        self.buf = b""
        self.r = result
        self.t0 = t0

    def feed(self, data):
        self.buf += data.replace(b"\r\n", b"\n")
        while True:
            i = self.buf.find(b"\n\n")
            if i < 0:
                return
            event, self.buf = self.buf[:i], self.buf[i + 2 :]
            datas = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
            if not datas:
                continue
            if self.r.ttfb_ms is None:
                self.r.ttfb_ms = (time.perf_counter() - self.t0) * 1000.0
            if datas[-1] == b"[DONE]":
                self.r.done = True
            elif self.r.done:
                self.r.error = "event after [DONE]"
            else:
                self.r.events += 1


async def read_body(reader, headers, parser):
    """Read the response body, feeding the SSE parser; returns True if it ended cleanly."""
    te = headers.get("transfer-encoding", "").lower()
    if "chunked" in te:
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # trailers until the blank line
                while True:
                    t = await reader.readuntil(b"\r\n")
                    if t == b"\r\n":
                        return True
            data = await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise ValueError("bad chunk terminator")
            parser.feed(data)
    if "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await reader.read(min(remaining, 65536))
            if not data:
                return False
            remaining -= len(data)
            parser.feed(data)
        return True
    # no framing: read until the server closes
    while True:
        data = await reader.read(65536)
        if not data:
            return True
        parser.feed(data)


class Gate:
    """Counts streams that have connected (or failed to); releases all of them at once."""

    def __init__(self, n):
        self.n = n
        self.arrived = 0
        self.all_arrived = asyncio.Event()
        self.start = asyncio.Event()

    def arrive(self):
        self.arrived += 1
        if self.arrived >= self.n:
            self.all_arrived.set()


async def one_stream(host, port, request, gate, timeout, result):
    writer = None
    arrived = False
    try:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        finally:
            gate.arrive()
            arrived = True
        await gate.start.wait()

        async def run():
            t0 = time.perf_counter()
            result.t_start = t0
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            result.head_ms = (time.perf_counter() - t0) * 1000.0
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            result.status = int(parts[1])
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            parser = SseParser(result, t0)
            result.clean_end = await read_body(reader, headers, parser)
            result.t_end = time.perf_counter()
            result.total_ms = (result.t_end - t0) * 1000.0

        await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        result.error = "timeout"
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if not arrived:
            gate.arrive()
        if writer is not None:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 2)
            except (OSError, asyncio.TimeoutError):
                pass


async def one_round(args, host, port, request):
    gate = Gate(args.streams)
    results = [StreamResult() for _ in range(args.streams)]
    tasks = [
        asyncio.create_task(one_stream(host, port, request, gate, args.timeout, r)) for r in results
    ]
    # Let every stream connect (bounded), then release them together.
    try:
        await asyncio.wait_for(gate.all_arrived.wait(), min(args.timeout, 10.0))
    except asyncio.TimeoutError:
        pass
    t_round = time.perf_counter()
    gate.start.set()
    done, pending = await asyncio.wait(tasks, timeout=args.timeout + 15)
    for t in pending:
        t.cancel()
    for r, t in zip(results, tasks):
        if t in pending and r.error is None:
            r.error = "timeout"
    return results, (time.perf_counter() - t_round) * 1000.0


def max_in_flight(results):
    """The most streams that were in flight at once (request written, body not yet ended), over the
    streams that completed."""
    edges = []
    for r in results:
        if r.t_start is not None and r.t_end is not None:
            edges.append((r.t_start, 1))
            edges.append((r.t_end, -1))
    edges.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


def summary(all_results, round_ms, expected_events, per_round=None):
    complete = [r for r in all_results if r.complete(expected_events)]
    errors = [r for r in all_results if r.error is not None]
    non2xx = [r for r in all_results if r.status is not None and not (200 <= r.status < 300)]
    incomplete = len(all_results) - len(complete)
    error_kinds = {}
    for r in errors:
        k = r.error.split(":", 1)[0]
        error_kinds[k] = error_kinds.get(k, 0) + 1
    ttfb = [r.ttfb_ms for r in complete]
    by_round = [[r.ttfb_ms for r in rr if r.complete(expected_events)] for rr in (per_round or [])]
    head = [r.head_ms for r in complete]
    total = [r.total_ms for r in complete]

    def r3(x):
        return None if x is None else round(x, 3)

    return {
        "streams": len(all_results),
        "completed": len(complete),
        "incomplete": incomplete,
        "errors": len(errors),
        "error_kinds": error_kinds,
        "non_2xx": len(non2xx),
        "expected_data_events": expected_events,
        "head_p50_ms": r3(percentile(head, 50)),
        "head_p99_ms": r3(percentile(head, 99)),
        "ttfb_p50_ms": r3(percentile(ttfb, 50)),
        "ttfb_p99_ms": r3(percentile(ttfb, 99)),
        "ttfb_max_ms": r3(max(ttfb) if ttfb else None),
        "total_p50_ms": r3(percentile(total, 50)),
        "total_p99_ms": r3(percentile(total, 99)),
        "total_max_ms": r3(max(total) if total else None),
        "total_min_ms": r3(min(total) if total else None),
        "max_in_flight": max_in_flight(complete),
        "round_ms": [round(x, 1) for x in round_ms],
        "ttfb_p50_ms_by_round": [r3(percentile(t, 50)) for t in by_round],
        "ttfb_p99_ms_by_round": [r3(percentile(t, 99)) for t in by_round],
    }


async def main_async(args):
    u = urlsplit(args.url)
    if u.scheme != "http":
        raise SystemExit("only http:// URLs are supported")
    host, port = u.hostname, u.port or 80
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("127."):
        raise SystemExit("refusing to load-test a non-loopback address")
    path = u.path + (("?" + u.query) if u.query else "")
    body = b'{"stream":true}'
    request = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {u.netloc}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-fake-chunks: {args.events}\r\n"
        f"x-fake-gap-ms: {args.gap_ms}\r\n"
        f"x-fake-key: {args.key}\r\n"
        "Connection: close\r\n"
        "\r\n"
    ).encode("latin-1") + body
    all_results, round_ms, per_round = [], [], []
    for i in range(args.rounds):
        req = request
        if args.shared_idempotency_key:
            req = request.replace(b"Connection: close\r\n", f"Idempotency-Key: {args.key}-{i}\r\nConnection: close\r\n".encode())
        results, ms = await one_round(args, host, port, req)
        all_results.extend(results)
        per_round.append(results)
        round_ms.append(ms)
    return summary(all_results, round_ms, args.events, per_round)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="http://127.0.0.1:PORT/path (loopback only)")
    ap.add_argument("--streams", type=int, default=200, help="concurrent streams per round")
    ap.add_argument("--events", type=int, default=20, help="data events per stream (x-fake-chunks)")
    ap.add_argument("--gap-ms", type=int, default=10, help="gap between events (x-fake-gap-ms)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of --streams concurrent streams")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per stream")
    ap.add_argument("--key", default="bench-sse", help="x-fake-key header (upstream counts per key)")
    ap.add_argument("--shared-idempotency-key", action="store_true",
                    help="every stream of a round carries the same Idempotency-Key (one per round): one "
                         "original, the others follow it")
    args = ap.parse_args()
    if not (1 <= args.streams <= 5000 and 1 <= args.rounds <= 100 and 0 < args.timeout <= 300):
        raise SystemExit("streams must be 1..5000, rounds 1..100, timeout 0..300 s")
    # one socket per stream: make sure the fd limit allows them (soft limit up to the hard one)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < args.streams + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out = asyncio.run(main_async(args))
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
