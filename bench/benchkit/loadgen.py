"""The load generators (wrk, oha, bench/sse_client.py): running them, bounded in time, on the load
core, and reading what they print."""

import json
import os
import selectors
import signal
import sys
import time

from .common import BENCH, LOAD_CPU, BenchError
from .lua import WRK_IDEM_LUA, WRK_LUA
from .tools import find_tool


def parse_wrk(out):
    """wrk's summary from its stdout: the `WRKJSON {...}` line the scripts' done() prints, as a
    dict (None when there is no such line)."""
    for line in out.splitlines():
        if line.startswith("WRKJSON "):
            return json.loads(line[8:])
    return None


def wrk_errors(w):
    """wrk's socket errors: connect, read, write and timeout."""
    return w["connect"] + w["read"] + w["write"] + w["timeout"]


def wrk_lost(w):
    """wrk's socket errors and its responses with a status >= 400."""
    return wrk_errors(w) + w["status"]


def oha_summary(o):
    """What the harness keeps of oha's JSON (`--output-format json`): the requests (answered or
    failed), the 2xx ones, the others, the errors by kind, the rate and the latencies in seconds."""
    codes = {int(k): v for k, v in (o.get("statusCodeDistribution") or {}).items()}
    ok = sum(v for k, v in codes.items() if 200 <= k < 300)
    errors = o.get("errorDistribution") or {}
    pct = o.get("latencyPercentiles") or {}
    summ = o.get("summary") or {}
    return {
        "requests": sum(codes.values()) + sum(errors.values()),
        "ok": ok,
        "non2xx": sum(codes.values()) - ok,
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "rps": summ.get("requestsPerSec"),
        "p50_s": pct.get("p50"),
        "p99_s": pct.get("p99"),
        "p999_s": pct.get("p99.9"),
        "max_s": summ.get("slowest"),
    }


def parse_json_output(tool, rc, out, err):
    """The one JSON document a tool printed on stdout; a BenchError with both streams' ends if not."""
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        raise BenchError(f"{tool} failed (exit {rc}):\n{out[-2000:]}\n{err[-2000:]}")


def run_wrk(procs, tmp, url, seconds, connections, key, lua=WRK_LUA):
    script = tmp / f"wrk-{key}.lua"
    script.write_text(lua.format(key=key))
    argv = [find_tool("wrk"), "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "-s", script, url]
    rc, out, err = procs.run_tool("wrk", argv, LOAD_CPU, timeout=seconds + 30)
    w = parse_wrk(out)
    if w is None:
        raise BenchError(f"wrk failed (exit {rc}):\n{out}\n{err}")
    return w


def run_oha(procs, url, seconds, rate, connections, key):
    argv = [
        find_tool("oha"), "--no-tui", "--output-format", "json",
        "-z", f"{seconds}s", "-c", str(connections), "-q", str(rate), "--latency-correction", "-w",
        "-m", "POST", "-d", "{}", "-T", "application/json", "-H", f"x-fake-key: {key}", url,
    ]
    rc, out, err = procs.run_tool("oha", argv, LOAD_CPU, timeout=seconds + 60)
    return parse_json_output("oha", rc, out, err)


def sse_argv(args, url, key, shared_key=False):
    return [
        sys.executable, BENCH / "sse_client.py", "--url", url, "--streams", args.sse_streams,
        "--events", args.sse_events, "--gap-ms", args.sse_gap_ms, "--rounds", args.sse_rounds,
        "--timeout", 30, "--key", key,
    ] + (["--shared-idempotency-key"] if shared_key else [])


def run_sse(procs, args, url, key, shared_key=False):
    argv = sse_argv(args, url, key, shared_key)
    rc, out, err = procs.run_tool("sse_client", argv, LOAD_CPU, timeout=args.sse_rounds * 60 + 30)
    return parse_json_output("sse_client", rc, out, err)


def read_until_limit(p, limit, timeout_s, at_limit):
    """Read wrk's stdout until its script prints LIMIT, then call at_limit(pid) (or take True);
    returns (what was read, what at_limit returned, or None when wrk ended before the limit)."""
    deadline = time.monotonic() + timeout_s + 30
    marked, seen = None, b""
    # raw reads (a buffered readline could hold the LIMIT line while select waits)
    fd = p.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while marked is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"wrk did not reach {limit} responses within {timeout_s} s")
            if not sel.select(timeout=left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # wrk ended (error, or -d elapsed) before the limit
            seen += chunk
            if b"\nLIMIT\n" in b"\n" + seen:
                marked = at_limit(p.pid) if at_limit else True
    return seen, marked


def run_wrk_keyed(procs, tmp, url, limit, connections, key, timeout_s, at_limit=None):
    """`limit` POSTs with fresh idempotency keys (a few more reach the proxy: wrk abandons the
    requests in flight when it stops). `at_limit()` is called as soon as wrk reports the
    `limit`-th response, with wrk's pid; returns (wrk's summary, what at_limit returned)."""
    script = tmp / f"wrk-{key}.lua"
    script.write_text(WRK_IDEM_LUA.format(key=key, limit=limit))
    argv = [find_tool("wrk"), "-t1", f"-c{connections}", f"-d{timeout_s}s", "--timeout", "5s", "-s", script, url]
    p = procs.spawn("wrk", argv, LOAD_CPU, capture=True)
    try:
        seen, marked = read_until_limit(p, limit, timeout_s, at_limit)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=30)
        out = seen.decode(errors="replace") + out.decode(errors="replace")
        err = err.decode(errors="replace")
    finally:
        procs.stop(p, signal.SIGKILL)
    w = parse_wrk(out)
    if w is None:
        raise BenchError(f"wrk failed (exit {p.returncode}):\n{out}\n{err}")
    if marked is None:
        raise BenchError(f"wrk ended before {limit} responses:\n{out}\n{err}")
    return w, marked
