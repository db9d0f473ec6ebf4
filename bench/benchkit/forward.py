"""The forward mode (the default): direct, nginx, rebound (and the hyper floor) on the same forward
path, each through throughput, latency at a fixed rate, and concurrent SSE streams."""

import time

from .common import LOAD_CPU, PROXY_CPU, URLS, log
from .loadgen import oha_summary, run_oha, run_sse, run_wrk, wrk_errors
from .net import http_request, upstream_count
from .phase import Phase, settle
from .procs import check_upstream, start_upstream
from .render import columns_table, metric_header, print_appended, print_noise_warning
from .results import append_result, now_ts
from .stats import aggregate, ms, per
from .targets import TARGET_CLASSES

ROWS = [
    # (label, metric key, format, scale)
    ("throughput c=64 (req/s)", "thr_rps", "{:.0f}", 1),
    ("proxy CPU per request @c64 (us)", "thr_cpu_us_per_req", "{:.1f}", 1),
    ("  same, scheduler runtime (us)", "thr_sched_cpu_us_per_req", "{:.1f}", 1),
    ("proxy core busy @c64 (%)", "thr_proxy_core_util", "{:.0f}", 100),
    ("load+upstream core busy @c64 (%)", "thr_load_core_busy_pct", "{:.0f}", 1),
    ("latency p50 @1k rps (ms)", "lat_p50_ms", "{:.3f}", 1),
    ("latency p99 @1k rps (ms)", "lat_p99_ms", "{:.3f}", 1),
    ("latency p99.9 @1k rps (ms)", "lat_p999_ms", "{:.3f}", 1),
    ("added p50 vs direct (ms)", "added_p50_ms", "{:.3f}", 1),
    ("added p99 vs direct (ms)", "added_p99_ms", "{:.3f}", 1),
    ("added p99.9 vs direct (ms)", "added_p999_ms", "{:.3f}", 1),
    ("proxy CPU per request @1k rps (us)", "lat_cpu_us_per_req", "{:.1f}", 1),
    ("  same, scheduler runtime (us)", "lat_sched_cpu_us_per_req", "{:.1f}", 1),
    ("SSE first event p50 (ms)", "sse_ttfb_p50_ms", "{:.2f}", 1),
    ("SSE first event p99 (ms)", "sse_ttfb_p99_ms", "{:.2f}", 1),
    ("SSE stream total p50 (ms)", "sse_total_p50_ms", "{:.1f}", 1),
    ("SSE stream total p99 (ms)", "sse_total_p99_ms", "{:.1f}", 1),
    ("proxy CPU per SSE stream (us)", "sse_cpu_us_per_stream", "{:.0f}", 1),
    ("  same, scheduler runtime (us)", "sse_sched_cpu_us_per_stream", "{:.0f}", 1),
    ("RSS idle (MiB)", "rss_idle_kib", "{:.1f}", 1 / 1024),
    ("RSS peak, VmHWM (MiB)", "rss_peak_kib", "{:.1f}", 1 / 1024),
    ("lost: errors+non-2xx+incomplete", "lost", "{:.0f}", 1),
    ("other processes' CPU, worst phase (%)", "other_cpu_pct", "{:.0f}", 1),
]
# rows without a rebound/nginx ratio
NO_RATIO = ("lost", "other_cpu_pct")


def throughput_metrics(w, ph):
    """The throughput phase's numbers from wrk's summary and the phase's CPU accounting."""
    cpu, sched = ph["cpu_s"], ph["sched_s"]
    return {
        "thr_requests": w["requests"],
        "thr_rps": w["requests"] / (w["duration_us"] / 1e6),
        "thr_cpu_s": cpu,
        "thr_cpu_us_per_req": per(cpu, w["requests"]),
        "thr_sched_cpu_us_per_req": per(sched, w["requests"]),
        "thr_proxy_core_util": None if cpu is None else cpu / ph["wall_s"],
        "thr_load_core_busy_pct": ph["core1_busy_pct"],
        "thr_other_cpu_pct": ph["other_cpu_pct"],
        "thr_steal_pct": ph["steal_pct"],
        "thr_p50_ms": w["p50_us"] / 1000.0,
        "thr_p99_ms": w["p99_us"] / 1000.0,
        "thr_errors": wrk_errors(w),
        "thr_non2xx": w["status"],
    }


def latency_metrics(o, ph, received):
    """The latency phase's numbers from oha's JSON, the phase's CPU accounting and the upstream's
    count of the phase's requests (CPU per request: per 2xx response)."""
    cpu, sched = ph["cpu_s"], ph["sched_s"]
    s = oha_summary(o)
    return {
        "lat_other_cpu_pct": ph["other_cpu_pct"],
        "lat_steal_pct": ph["steal_pct"],
        "lat_requests": s["requests"],
        "lat_rps": s["rps"],
        "lat_p50_ms": ms(s["p50_s"]),
        "lat_p99_ms": ms(s["p99_s"]),
        "lat_p999_ms": ms(s["p999_s"]),
        "lat_max_ms": ms(s["max_s"]),
        "lat_cpu_s": cpu,
        "lat_cpu_us_per_req": per(cpu, s["ok"]),
        "lat_sched_cpu_us_per_req": per(sched, s["ok"]),
        "lat_errors": s["errors"],
        "lat_error_kinds": s["error_kinds"],
        "lat_non2xx": s["non2xx"],
        "lat_upstream_received": received,
        "lat_upstream_mismatch": None if received is None else received - s["requests"],
    }


def sse_metrics(s, ph, received):
    """The SSE phase's numbers from sse_client.py's JSON, the phase's CPU accounting and the
    upstream's count of the phase's streams."""
    cpu, sched = ph["cpu_s"], ph["sched_s"]
    m = {
        "sse_other_cpu_pct": ph["other_cpu_pct"],
        "sse_steal_pct": ph["steal_pct"],
        "sse_streams": s["streams"],
        "sse_completed": s["completed"],
        "sse_incomplete": s["incomplete"],
        "sse_errors": s["errors"],
        "sse_error_kinds": s["error_kinds"],
        "sse_non2xx": s["non_2xx"],
    }
    for k in ("head_p50_ms", "head_p99_ms", "ttfb_p50_ms", "ttfb_p99_ms", "total_p50_ms", "total_p99_ms", "total_max_ms"):
        m["sse_" + k] = s[k]
    m["sse_ttfb_p50_ms_by_round"] = s.get("ttfb_p50_ms_by_round")
    m["sse_ttfb_p99_ms_by_round"] = s.get("ttfb_p99_ms_by_round")
    m["sse_cpu_s"] = cpu
    m["sse_cpu_us_per_stream"] = per(cpu, s["streams"])
    m["sse_sched_cpu_us_per_stream"] = per(sched, s["streams"])
    m["sse_upstream_received"] = received
    m["sse_upstream_mismatch"] = None if received is None else received - s["streams"]
    return m


def totals(m):
    """The worst phase's noise and the failures of every phase, added to a target's metrics."""
    m["other_cpu_pct"] = max(m["thr_other_cpu_pct"], m["lat_other_cpu_pct"], m["sse_other_cpu_pct"])
    m["lost"] = m["thr_errors"] + m["thr_non2xx"] + m["lat_errors"] + m["lat_non2xx"] + m["sse_incomplete"]
    return m


def measure(target, args, run_tag, direct_body_len, upstream_pid):
    """All phases against one started target; returns a flat dict of metrics."""
    m = {}
    key = lambda phase: f"{run_tag}-{target.name}-{phase}"  # noqa: E731

    # sanity: the same forward path answers the same body
    status, body = http_request("POST", target.url, b"{}", {"content-type": "application/json"})
    m["sanity_status"] = status
    m["response_bytes"] = len(body)
    if direct_body_len is not None and len(body) != direct_body_len:
        log(f"warning: {target.name} body is {len(body)} bytes, direct is {direct_body_len}")

    time.sleep(0.5)
    m["rss_idle_kib"] = target.mem("VmRSS")
    m["pss_idle_kib"] = target.pss()

    # warm-up (not measured): connection pools, page faults, allocator
    if args.warmup > 0:
        run_wrk(target.procs, target.tmp, target.url, args.warmup, args.connections, key("warmup"))

    # 1. throughput, closed loop, concurrency 64
    settle(args)
    log(f"  {target.name}: throughput, c={args.connections}, {args.duration} s (wrk)")
    ph = Phase(target, upstream_pid)
    w = run_wrk(target.procs, target.tmp, target.url, args.duration, args.connections, key("thr"))
    m.update(throughput_metrics(w, ph.end()))
    m["thr_upstream_received"] = upstream_count(key("thr"))

    # 2. latency at a fixed rate, corrected for coordinated omission
    settle(args)
    log(f"  {target.name}: latency, {args.rate} req/s, {args.latency_duration} s (oha)")
    ph = Phase(target, upstream_pid)
    o = run_oha(target.procs, target.url, args.latency_duration, args.rate, args.latency_connections, key("lat"))
    ph = ph.end()
    m.update(latency_metrics(o, ph, upstream_count(key("lat"))))

    # 3. concurrent SSE streams
    settle(args)
    log(
        f"  {target.name}: {args.sse_rounds} x {args.sse_streams} concurrent SSE streams of "
        f"{args.sse_events} events {args.sse_gap_ms} ms apart"
    )
    ph = Phase(target, upstream_pid)
    s = run_sse(target.procs, args, target.url, key("sse"))
    ph = ph.end()
    m.update(sse_metrics(s, ph, upstream_count(key("sse"))))

    m["rss_peak_kib"] = target.mem("VmHWM")
    return totals(m)


def added_vs_direct(results):
    """Each target's latency percentiles minus direct's in the same run (added_*_ms; None for
    direct itself), when direct ran."""
    if "direct" not in results:
        return
    d = results["direct"]
    for name, m in results.items():
        for p in ("p50", "p99", "p999"):
            a, b = m.get(f"lat_{p}_ms"), d.get(f"lat_{p}_ms")
            m[f"added_{p}_ms"] = None if a is None or b is None or name == "direct" else a - b


def forward_table(agg, targets, runs):
    header = [metric_header(runs)] + list(targets)
    ratio = None
    if "rebound" in agg and "nginx" in agg:
        header.append("rebound/nginx")
        keys = {key for _, key, _, _ in ROWS if key not in NO_RATIO}
        ratio = ("rebound/nginx", "rebound", "nginx", keys)
    return columns_table(header, ROWS, agg, targets, ratio)


def print_table(agg, targets, runs):
    print(forward_table(agg, targets, runs), flush=True)


def run_order(targets, run):
    """direct first, then the proxies, in reverse order on odd runs so that drift favours none."""
    proxies = [t for t in targets if t != "direct"]
    if run % 2 == 1:
        proxies.reverse()
    return (["direct"] if "direct" in targets else []) + proxies


def forward_run(args, procs, tmp, run):
    """One run: a fresh fake provider, then each target started, measured and stopped in turn."""
    order = run_order(args.targets, run)
    log(f"run {run + 1}/{args.runs}: order {', '.join(order)}")
    upstream, up_log = start_upstream(procs, tmp, run)
    direct_len = len(http_request("POST", URLS["direct"], b"{}", {"content-type": "application/json"})[1])
    results = {}
    for name in order:
        target = TARGET_CLASSES[name](procs, tmp)
        target.start()
        try:
            results[name] = measure(target, args, f"r{run}", direct_len, upstream.pid)
        finally:
            target.stop()
        check_upstream(upstream, up_log)
    procs.stop(upstream)
    added_vs_direct(results)
    return results


def forward_main(args, procs, tmp, info):
    per_target = {t: [] for t in args.targets}
    for run in range(args.runs):
        results = forward_run(args, procs, tmp, run)
        ts = now_ts()
        for name in args.targets:
            per_target[name].append(results[name])
            if args.results:
                append_result(args.results, info.record(ts=ts, run=run + 1, runs=args.runs, target=name,
                                                        url=URLS[name], metrics=results[name]))
        if args.runs > 1:
            print(f"\nrun {run + 1}/{args.runs}:", flush=True)
            print_table({t: per_target[t][-1] for t in args.targets}, args.targets, 1)
    agg = {t: aggregate(per_target[t]) for t in args.targets}
    print(info.headline(f"proxy on core {PROXY_CPU}, load+upstream on core {LOAD_CPU}"), flush=True)
    print_table(agg, args.targets, args.runs)
    lost = sum(a.get("lost", 0) for a in agg.values())
    mism = sum(v for a in agg.values() for k, v in a.items() if k.endswith("_mismatch"))
    if lost or mism:
        print(f"\nWARNING: {lost:.0f} requests/streams lost, upstream count mismatch {mism:+.0f} "
              f"(details in {args.results or 'the per-run metrics'})", flush=True)
    print_noise_warning(agg.values())
    print_appended(args.results, len(args.targets) * args.runs)
