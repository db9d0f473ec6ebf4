"""The idempotency mode: rebound's CPU per keyed request with its in-memory idempotency store
empty, then full (every new record evicting one)."""

import statistics
import time

from .common import IDEM_MAX_ENTRIES, LOAD_CPU, PROXY_CPU, URLS, BenchError, log
from .loadgen import run_wrk_keyed, wrk_errors, wrk_lost
from .net import upstream_count
from .phase import Phase, settle
from .procs import check_upstream, start_upstream
from .render import columns_table, metric_header, print_appended, print_noise_warning
from .results import append_result, now_ts
from .stats import aggregate, per, ratio
from .targets import ReboundIdempotency

STATES = ("empty", "full")


def new_acc():
    """A state's sums over the repetitions of a run."""
    return {"cpu_s": 0.0, "sched_s": 0.0, "requests": 0, "wall_s": 0.0, "errors": 0, "non2xx": 0,
            "other_cpu_pct": 0.0, "p50_ms": [], "p99_ms": [], "upstream": 0}


def add_phase(a, requests, w, ph, received):
    """One measured phase (`requests` keyed requests) added to its state's sums."""
    a["cpu_s"] += ph["cpu_s"]
    a["sched_s"] += ph["sched_s"]
    a["requests"] += requests
    a["upstream"] += received
    a["wall_s"] += ph["wall_s"]
    a["errors"] += wrk_errors(w)
    a["non2xx"] += w["status"]
    a["other_cpu_pct"] = max(a["other_cpu_pct"], ph["other_cpu_pct"])
    a["p50_ms"].append(w["p50_us"] / 1000.0)
    a["p99_ms"].append(w["p99_us"] / 1000.0)


def idem_metrics(acc, prefill, reps):
    """A run's metrics per state from its sums; the full state's line also has full/empty ratios."""
    out = {}
    for state, a in acc.items():
        n = a["requests"]
        out[state] = {
            "idem_state": state,
            "idem_prefill": prefill if state == "full" else 0,
            "idem_reps": reps,
            "idem_requests": n,
            "idem_upstream_received": a["upstream"],
            "idem_cpu_s": a["cpu_s"],
            "idem_sched_s": a["sched_s"],
            "idem_cpu_us_per_req": per(a["cpu_s"], n),
            "idem_sched_cpu_us_per_req": per(a["sched_s"], n),
            "idem_rps": n / a["wall_s"] if a["wall_s"] else None,
            "idem_p50_ms": statistics.median(a["p50_ms"]),
            "idem_p99_ms": statistics.median(a["p99_ms"]),
            "idem_errors": a["errors"],
            "idem_non2xx": a["non2xx"],
            "lost": a["errors"] + a["non2xx"],
            "other_cpu_pct": a["other_cpu_pct"],
        }
    for k in ("idem_cpu_us_per_req", "idem_sched_cpu_us_per_req"):
        out["full"][k.replace("_us_per_req", "_full_over_empty")] = ratio(out["full"][k], out["empty"][k])
    return out


def idem_phase(args, procs, tmp, target, state, rep, tag, upstream_pid):
    """On a started rebound: for `full` the pre-fill, then the measured keyed requests. Returns
    (wrk's summary, the phase's CPU accounting, the upstream's count of the phase's requests)."""
    url = URLS["rebound"]
    if state == "full":
        log(f"  rep {rep + 1}/{args.idem_reps}: filling the store with {args.idem_prefill} keyed requests")
        w, _ = run_wrk_keyed(procs, tmp, url, args.idem_prefill, args.connections, tag + "-fill", 120)
        if wrk_lost(w):
            raise BenchError(f"pre-fill had errors: {w}")
    settle(args)
    log(f"  rep {rep + 1}/{args.idem_reps}: {state}: {args.idem_requests} keyed requests, c={args.connections}")
    # wrk is still running when the phase ends: its CPU is read from /proc then
    running = []
    ph = Phase(target, upstream_pid, running)

    def at_limit(pid, ph=ph, running=running):
        running.append(pid)
        return ph.end()

    w, ph = run_wrk_keyed(procs, tmp, url, args.idem_requests, args.connections, tag, 120, at_limit)
    time.sleep(0.2)  # the requests wrk abandoned reach the upstream (counted, not measured)
    # the phase ends at the limit-th response: that many requests were served in it
    # (the few in flight then are cut short on both sides). Every fresh key reaches
    # the upstream once: its count checks that none was answered any other way.
    received = upstream_count(tag) or 0
    if received < args.idem_requests or (state == "empty" and received >= IDEM_MAX_ENTRIES):
        raise BenchError(f"upstream received {received} of the {state} phase's keyed requests")
    return w, ph, received


def measure_idempotency(args, procs, tmp, run_tag, upstream_pid):
    """One run: for each repetition, a fresh rebound per state; `full` is pre-filled with
    `--idem-prefill` keyed requests first. Returns {"empty": metrics, "full": metrics}."""
    acc = {st: new_acc() for st in STATES}
    for rep in range(args.idem_reps):
        order = ["empty", "full"] if rep % 2 == 0 else ["full", "empty"]
        for state in order:
            target = ReboundIdempotency(procs, tmp)
            target.start()
            try:
                tag = f"{run_tag}-idem{rep}-{state}"
                w, ph, received = idem_phase(args, procs, tmp, target, state, rep, tag, upstream_pid)
                add_phase(acc[state], args.idem_requests, w, ph, received)
            finally:
                target.stop()
    return idem_metrics(acc, args.idem_prefill, args.idem_reps)


IDEM_ROWS = [
    ("keyed requests measured", "idem_requests", "{:.0f}", 1),
    ("keys already stored before each phase", "idem_prefill", "{:.0f}", 1),
    ("proxy CPU per keyed request (us)", "idem_cpu_us_per_req", "{:.1f}", 1),
    ("  same, scheduler runtime (us)", "idem_sched_cpu_us_per_req", "{:.1f}", 1),
    ("throughput (req/s)", "idem_rps", "{:.0f}", 1),
    ("wrk latency p50 (ms)", "idem_p50_ms", "{:.3f}", 1),
    ("wrk latency p99 (ms)", "idem_p99_ms", "{:.3f}", 1),
    ("lost: errors+non-2xx", "lost", "{:.0f}", 1),
    ("other processes' CPU, worst phase (%)", "other_cpu_pct", "{:.0f}", 1),
]
IDEM_RATIO_KEYS = ("idem_cpu_us_per_req", "idem_sched_cpu_us_per_req", "idem_rps", "idem_p50_ms", "idem_p99_ms")


def idem_table(agg, runs):
    header = [metric_header(runs), "store empty", "store full", "full/empty"]
    return columns_table(header, IDEM_ROWS, agg, STATES, ("full/empty", "full", "empty", IDEM_RATIO_KEYS))


def print_idem_table(agg, runs):
    print(idem_table(agg, runs), flush=True)


def idem_main(args, procs, tmp, info):
    per_state = {"empty": [], "full": []}
    for run in range(args.runs):
        log(f"run {run + 1}/{args.runs}: idempotency store empty vs full")
        upstream, up_log = start_upstream(procs, tmp, run)
        results = measure_idempotency(args, procs, tmp, f"r{run}", upstream.pid)
        check_upstream(upstream, up_log)
        procs.stop(upstream)
        ts = now_ts()
        for state in STATES:
            per_state[state].append(results[state])
            if args.results:
                line = info.record(ts=ts, run=run + 1, runs=args.runs, target=f"rebound-idem-{state}",
                                   url=URLS["rebound"], metrics=results[state])
                append_result(args.results, line)
        if args.runs > 1:
            print(f"\nrun {run + 1}/{args.runs}:", flush=True)
            print_idem_table({st: per_state[st][-1] for st in per_state}, 1)
    agg = {st: aggregate(per_state[st]) for st in per_state}
    print(info.headline(f"rebound on core {PROXY_CPU}, wrk+upstream on core {LOAD_CPU}; "
                        f"in-memory idempotency store (max {IDEM_MAX_ENTRIES} records), a fresh key per request"),
          flush=True)
    print_idem_table(agg, args.runs)
    lost = sum(a.get("lost", 0) for a in agg.values())
    if lost:
        print(f"\nWARNING: {lost:.0f} requests lost (errors or non-2xx)", flush=True)
    print_noise_warning(agg.values())
    print_appended(args.results, 2 * args.runs)
