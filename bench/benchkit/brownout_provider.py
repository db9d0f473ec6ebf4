#!/usr/bin/env python3
"""The brownout mode's provider: an OpenAI-shaped chat endpoint whose capacity changes over time.

    python3 bench/benchkit/brownout_provider.py --port 19010 --phases 32:30,8:60,32:30 [--ttft-ms 200]
        [--events 8] [--gap-ms 100]

Every request is a streamed chat completion: the first event after `--ttft-ms`, then `--events - 1`
more `--gap-ms` apart, then `[DONE]` (about a second each by default). At most the phase's capacity
run at once. Above it the provider does what providers do in a brownout: it queues up to half its
capacity (first in, first out: the time to first token rises by the wait), and answers the rest at
once, 529 `overloaded_error` and 429 `rate_limit_error` (no `retry-after`) in turn.

The phases start at `POST /_brownout/start` (before it: the first phase's capacity, for a warm-up);
`GET /_brownout/stats` answers JSON: per phase, the calls, those answered 200, 429 and 529, the most
running and queued at once, and the time to first token of each request it served (from its
arrival: its wait in the provider's queue included). Loopback only; stdlib only.
"""

import argparse
import asyncio
import json
import time
from collections import deque

OK_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
           b"transfer-encoding: chunked\r\n\r\n")


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(i):
    body = {"id": "chatcmpl-brownout", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
            "choices": [{"index": 0, "delta": {"content": f"token{i} "}, "finish_reason": None}]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def refusal(status):
    """The refusal of a request over capacity: 529 overloaded, or 429 rate limited (no reset)."""
    if status == 529:
        reason, body = "Overloaded", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    else:
        reason, body = "Too Many Requests", {"error": {"type": "rate_limit_error", "code": "rate_limit_exceeded",
                                                        "message": "Rate limit reached, slow down"}}
    data = json.dumps(body).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason.encode(), len(data), data))


class Provider:
    def __init__(self, phases, ttft, events, gap):
        self.phases, self.ttft, self.events, self.gap = phases, ttft, events, gap
        self.started = None
        self.running = 0
        self.queue = deque()
        self.refusals = 0
        self.stats = [self.fresh() for _ in phases]

    @staticmethod
    def fresh():
        return {"calls": 0, "ok": 0, "429": 0, "529": 0, "most_running": 0, "most_queued": 0, "ttft_ms": []}

    def phase(self):
        """The current phase's index (the first before the start, the last after the end)."""
        if self.started is None:
            return 0
        t = time.monotonic() - self.started
        for i, (_, seconds) in enumerate(self.phases):
            if t < seconds:
                return i
            t -= seconds
        return len(self.phases) - 1

    def capacity(self):
        return self.phases[self.phase()][0]

    def release(self):
        """Queued requests start while there is room (capacity may have risen, or a request ended)."""
        while self.queue and self.running < self.capacity():
            fut = self.queue.popleft()
            if not fut.done():
                self.running += 1
                fut.set_result(None)

    async def admit(self, st):
        """Whether the request runs: at once, after a wait in the queue, or not at all (refused)."""
        cap = self.capacity()
        if self.running < cap and not self.queue:
            self.running += 1
        elif len(self.queue) < max(1, cap // 2):
            fut = asyncio.get_running_loop().create_future()
            self.queue.append(fut)
            st["most_queued"] = max(st["most_queued"], len(self.queue))
            await fut
        else:
            return False
        st["most_running"] = max(st["most_running"], self.running)
        return True

    async def serve(self, writer):
        st = self.stats[self.phase()]
        st["calls"] += 1
        arrived = time.monotonic()
        if not await self.admit(st):
            self.refusals += 1
            status = 529 if self.refusals % 2 else 429
            st[str(status)] += 1
            writer.write(refusal(status))
            await writer.drain()
            return
        try:
            await asyncio.sleep(self.ttft)
            st["ttft_ms"].append(round((time.monotonic() - arrived) * 1000, 1))
            writer.write(OK_HEAD + chunk(event(0)))
            await writer.drain()
            for i in range(1, self.events):
                await asyncio.sleep(self.gap)
                writer.write(chunk(event(i)))
                await writer.drain()
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            st["ok"] += 1
        finally:
            self.running -= 1
            self.release()

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length:
                    await reader.readexactly(length)
                if path == "/_brownout/start":
                    self.started, self.stats = time.monotonic(), [self.fresh() for _ in self.phases]
                    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                elif path == "/_brownout/stats":
                    data = json.dumps(self.stats).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(data), data))
                elif method == "POST":
                    await self.serve(writer)
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def tick(self):
        while True:
            await asyncio.sleep(0.05)
            self.release()


def parse_phases(text):
    """`32:30,8:60` -> [(32, 30.0), (8, 60.0)]: capacity and seconds of each phase."""
    phases = []
    for part in text.split(","):
        cap, _, seconds = part.partition(":")
        phases.append((int(cap), float(seconds)))
    if not phases or any(c < 1 or s <= 0 for c, s in phases):
        raise ValueError(f"phases: capacity:seconds,... with capacity >= 1, found {text!r}")
    return phases


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--phases", default="32:30,8:60,32:30")
    ap.add_argument("--ttft-ms", type=int, default=200)
    ap.add_argument("--events", type=int, default=8)
    ap.add_argument("--gap-ms", type=int, default=100)
    args = ap.parse_args()
    p = Provider(parse_phases(args.phases), args.ttft_ms / 1000, args.events, args.gap_ms / 1000)
    server = await asyncio.start_server(p.handle, "127.0.0.1", args.port, backlog=1024)
    asyncio.get_running_loop().create_task(p.tick())
    print(f"brownout provider listening on 127.0.0.1:{args.port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
