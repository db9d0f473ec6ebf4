"""The scale mode's two measurements on a fresh proxy each: many idle kept-alive connections, then
many concurrent SSE streams with the proxy's RSS sampled."""

import json
import os
import signal
import sys
import time
from pathlib import Path

from .common import BENCH, LOAD_CPU, BenchError, log
from .idle import IdleConnections
from .net import upstream_count
from .phase import Phase, settle
from .procs import tail
from .stats import ms, per


def fd_count(target):
    total = 0
    for p in target.pids():
        try:
            total += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    return total


def scale_idle_metrics(n, conns_failed, held, rss, fds, ph_open, ph_idle, closed, received):
    """The idle phase's numbers: rss = (before, all idle, after the idle period, after closing,
    VmHWM) in KiB, fds = (before, all idle)."""
    rss0, rss1, rss2, rss3, hwm = rss
    fds0, fds1 = fds
    return {
        "scale_idle_connections": n,
        "scale_idle_held": held,
        "scale_idle_failed": sum(conns_failed.values()),
        "scale_idle_fail_kinds": conns_failed,
        "scale_idle_open_s": ph_open["wall_s"],
        "scale_idle_open_cpu_us_per_conn": per(ph_open["cpu_s"], n),
        "scale_idle_open_sched_us_per_conn": per(ph_open["sched_s"], n),
        "scale_idle_rss_before_kib": rss0,
        "scale_idle_rss_kib": rss1,
        "scale_idle_rss_per_conn_kib": (rss1 - rss0) / held if held else None,
        "scale_idle_rss_after_idle_kib": rss2,
        "scale_idle_rss_closed_kib": rss3,
        "scale_idle_hwm_kib": hwm,
        "scale_idle_fds_before": fds0,
        "scale_idle_fds": fds1,
        "scale_idle_seconds": ph_idle["wall_s"],
        "scale_idle_cpu_ms": ms(ph_idle["cpu_s"]),
        "scale_idle_sched_ms": ms(ph_idle["sched_s"]),
        "scale_idle_core_pct": 100.0 * ph_idle["sched_s"] / ph_idle["wall_s"],
        "scale_idle_closed_by_proxy": closed,
        "scale_idle_upstream_received": received,
        "scale_idle_upstream_mismatch": None if received is None else received - held,
        "scale_idle_other_cpu_pct": max(ph_open["other_cpu_pct"], ph_idle["other_cpu_pct"]),
    }


def measure_scale_idle(args, procs, tmp, target, tag, upstream_pid):
    """--idle-connections kept-alive client connections on a fresh proxy: RSS before and with all
    of them idle, the proxy's CPU while they idle, and whether it kept them open."""
    target.start()
    conns = IdleConnections()
    try:
        settle(args)
        time.sleep(0.5)
        rss0, fds0 = target.mem("VmRSS"), fd_count(target)
        n = args.idle_connections
        log(f"  {target.name}: opening {n} keep-alive connections ({args.idle_batch} at a time), one POST each")
        ph = Phase(target, upstream_pid, include_self=True)
        conns.open(target.url, n, args.idle_batch, tag)
        ph_open = ph.end()
        held = len(conns.socks)
        time.sleep(2.0)
        rss1, fds1 = target.mem("VmRSS"), fd_count(target)
        log(f"  {target.name}: {held} connections idle; {args.idle_seconds} s of idle")
        ph = Phase(target, upstream_pid, include_self=True)
        time.sleep(args.idle_seconds)
        ph_idle = ph.end()
        rss2 = target.mem("VmRSS")
        closed = conns.closed_by_peer()
        received = upstream_count(tag)
        conns.close()
        time.sleep(2.0)
        rss3, hwm = target.mem("VmRSS"), target.mem("VmHWM")
    finally:
        conns.close()
        target.stop()
    return scale_idle_metrics(n, conns.failed, held, (rss0, rss1, rss2, rss3, hwm), (fds0, fds1), ph_open, ph_idle,
                              closed, received)


def scale_sse_metrics(s, n, events, gap, rss, samples, ph, received):
    """The streams phase's numbers from sse_client.py's JSON; rss = (before, peak sample, VmHWM)."""
    rss0, peak, hwm = rss
    return {
        "scale_sse_streams": s["streams"],
        "scale_sse_completed": s["completed"],
        "scale_sse_lost": s["incomplete"],
        "scale_sse_error_kinds": s["error_kinds"],
        "scale_sse_max_in_flight": s.get("max_in_flight"),
        "scale_sse_events": events,
        "scale_sse_gap_ms": gap,
        "scale_sse_rss_before_kib": rss0,
        "scale_sse_rss_peak_kib": peak,
        "scale_sse_rss_samples": samples,
        "scale_sse_hwm_kib": hwm,
        "scale_sse_rss_per_stream_kib": (peak - rss0) / n,
        "scale_sse_cpu_us_per_stream": per(ph["cpu_s"], n),
        "scale_sse_sched_cpu_us_per_stream": per(ph["sched_s"], n),
        "scale_sse_ttfb_p50_ms": s["ttfb_p50_ms"],
        "scale_sse_ttfb_p99_ms": s["ttfb_p99_ms"],
        "scale_sse_total_p50_ms": s["total_p50_ms"],
        "scale_sse_total_p99_ms": s["total_p99_ms"],
        "scale_sse_upstream_received": received,
        "scale_sse_upstream_mismatch": None if received is None else received - n,
        "scale_sse_other_cpu_pct": ph["other_cpu_pct"],
    }


def sample_rss(procs, p, target, rss0, limit_s):
    """The proxy's RSS every 100 ms until `p` exits (bounded by limit_s); returns (peak, samples)."""
    peak, samples = rss0, 0
    deadline = time.monotonic() + limit_s
    try:
        while p.poll() is None:
            if time.monotonic() > deadline:
                raise BenchError(f"sse_client did not finish within {limit_s} s")
            peak = max(peak, target.mem("VmRSS"))
            samples += 1
            time.sleep(0.1)
    finally:
        procs.stop(p, signal.SIGKILL)
    return peak, samples


def last_json_line(logf, p):
    """The last JSON object sse_client.py wrote to its log (its summary)."""
    lines = [line for line in Path(logf).read_text(errors="replace").splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"sse_client failed (exit {p.returncode}):\n{tail(logf)}")
    return json.loads(lines[-1])


def measure_scale_sse(args, procs, tmp, target, tag, upstream_pid, nofile):
    """--scale-streams concurrent SSE streams through a fresh proxy, its RSS sampled every 100 ms."""
    target.start()
    try:
        settle(args)
        time.sleep(0.5)
        rss0 = target.mem("VmRSS")
        n, events, gap = args.scale_streams, args.scale_events, args.scale_gap_ms
        stream_s = events * gap / 1000.0
        timeout = int(max(30, 3 * stream_s + 20))
        argv = [
            sys.executable, BENCH / "sse_client.py", "--url", target.url, "--streams", n, "--events", events,
            "--gap-ms", gap, "--rounds", 1, "--timeout", timeout, "--key", tag,
        ]
        log(f"  {target.name}: {n} concurrent SSE streams of {events} events {gap} ms apart")
        logf = tmp / f"sse-{tag}.log"
        ph = Phase(target, upstream_pid, include_self=True)
        p = procs.spawn("sse_client", argv, LOAD_CPU, logfile=logf, nofile=nofile)
        peak, samples = sample_rss(procs, p, target, rss0, timeout + 40)
        ph = ph.end()
        hwm = target.mem("VmHWM")
        received = upstream_count(tag)
    finally:
        target.stop()
    s = last_json_line(logf, p)
    return scale_sse_metrics(s, n, events, gap, (rss0, peak, hwm), samples, ph, received)
