"""The follow mode: one SSE stream fanned out to its followers (one Idempotency-Key per round)
against as many independent streams."""

from .cache import phase_order
from .common import LOAD_CPU, PROXY_CPU, URLS, log
from .loadgen import run_sse
from .net import upstream_count
from .phase import Phase, settle
from .procs import start_upstream
from .render import columns_table, metric_header, print_noise_warning
from .results import append_result, now_ts
from .stats import aggregate, per
from .targets import ReboundIdempotency

PHASES = ("independent", "followed")


def follow_metrics(s, ph, received, idle, peak):
    """One phase's numbers from sse_client.py's JSON, the phase's CPU, the upstream's count of its
    calls, and the proxy's RSS before the phase and its high-water mark after."""
    n = s["streams"]
    return {
        "follow_streams": n,
        "follow_completed": s["completed"],
        "follow_upstream_received": received,
        "follow_cpu_us_per_stream": per(ph["cpu_s"], n),
        "follow_sched_cpu_us_per_stream": per(ph["sched_s"], n),
        "follow_ttfb_p50_ms": s["ttfb_p50_ms"],
        "follow_ttfb_p99_ms": s["ttfb_p99_ms"],
        "follow_total_p99_ms": s["total_p99_ms"],
        "rss_idle_kib": idle,
        "rss_peak_kib": peak,
        "lost": s["incomplete"],
        "other_cpu_pct": ph["other_cpu_pct"],
        "steal_pct": ph["steal_pct"],
        "rss_added_kib": None if idle is None or peak is None else peak - idle,
    }


def measure_follow(args, procs, tmp, run_tag, upstream_pid):
    """One run: `--sse-rounds` rounds of `--sse-streams` concurrent streams on a fresh rebound per
    phase: 'independent' (no key: each stream is its own upstream call) and 'followed' (one
    Idempotency-Key per round: one upstream call, the others follow it). Returns {phase: metrics}."""
    url = URLS["rebound"]
    out = {}
    for phase in phase_order(run_tag, "independent", "followed"):
        target = ReboundIdempotency(procs, tmp)
        target.start()
        try:
            settle(args)
            idle = target.mem("VmRSS")
            tag = f"{run_tag}-follow-{phase}"
            log(f"  {phase}: {args.sse_rounds} x {args.sse_streams} concurrent streams of {args.sse_events} events "
                f"{args.sse_gap_ms} ms apart")
            ph = Phase(target, upstream_pid)
            s = run_sse(procs, args, url, tag, shared_key=(phase == "followed"))
            ph = ph.end()
            received = upstream_count(tag) or 0
            out[phase] = dict(follow_metrics(s, ph, received, idle, target.mem("VmHWM")), follow_phase=phase)
        finally:
            target.stop()
    return out


FOLLOW_ROWS = [
    ("streams", "follow_streams", "{:.0f}", 1),
    ("upstream calls", "follow_upstream_received", "{:.0f}", 1),
    ("proxy CPU per stream (us)", "follow_cpu_us_per_stream", "{:.0f}", 1),
    ("  same, scheduler runtime (us)", "follow_sched_cpu_us_per_stream", "{:.0f}", 1),
    ("first event p50 (ms)", "follow_ttfb_p50_ms", "{:.2f}", 1),
    ("first event p99 (ms)", "follow_ttfb_p99_ms", "{:.2f}", 1),
    ("stream total p99 (ms)", "follow_total_p99_ms", "{:.1f}", 1),
    ("RSS idle (MiB)", "rss_idle_kib", "{:.1f}", 1 / 1024),
    ("RSS peak, VmHWM (MiB)", "rss_peak_kib", "{:.1f}", 1 / 1024),
    ("RSS added by the phase (MiB)", "rss_added_kib", "{:.2f}", 1 / 1024),
    ("lost: incomplete streams", "lost", "{:.0f}", 1),
    ("other processes' CPU (%)", "other_cpu_pct", "{:.0f}", 1),
    ("hypervisor steal (%)", "steal_pct", "{:.0f}", 1),
]
FOLLOW_RATIO_KEYS = ("follow_cpu_us_per_stream", "follow_sched_cpu_us_per_stream")


def follow_table(agg, runs):
    header = [metric_header(runs), "independent", "followed", "followed/indep."]
    ratio = ("followed/indep.", "followed", "independent", FOLLOW_RATIO_KEYS)
    return columns_table(header, FOLLOW_ROWS, agg, PHASES, ratio)


def follow_main(args, procs, tmp, info):
    per_phase = {"independent": [], "followed": []}
    for run in range(args.runs):
        log(f"run {run + 1}/{args.runs}: independent streams vs one stream and its followers")
        upstream, _ = start_upstream(procs, tmp, run)
        results = measure_follow(args, procs, tmp, f"r{run}", upstream.pid)
        procs.stop(upstream)
        ts = now_ts()
        for phase, m in results.items():
            per_phase[phase].append(m)
            if args.results:
                line = info.record(ts=ts, run=run + 1, runs=args.runs, target=f"rebound-follow-{phase}",
                                   url=URLS["rebound"], metrics=m)
                append_result(args.results, line)
    agg = {p: aggregate(per_phase[p]) for p in per_phase}
    print(info.headline(f"rebound on core {PROXY_CPU}, clients+upstream on core {LOAD_CPU}; "
                        f"{args.sse_rounds} rounds of {args.sse_streams} streams ({args.sse_events} events, "
                        f"{args.sse_gap_ms} ms apart)"), flush=True)
    print(follow_table(agg, args.runs), flush=True)
    print_noise_warning(agg.values(), quiet_clause=False)
