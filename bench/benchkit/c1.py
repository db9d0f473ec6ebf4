"""The c1 mode: the latency each proxy adds when the app sends one request at a time (wrk -c1 -t1
on one kept-alive connection), and the proxy's CPU per request."""

from .common import LOAD_CPU, PROXY_CPU, log
from .loadgen import run_wrk, wrk_lost
from .phase import Phase, settle
from .procs import start_upstream
from .render import format_table
from .results import append_result, now_ts
from .stats import aggregate, per
from .targets import C1_TARGETS


def alternate(names, run):
    """The targets' order in run `run`: as given on even runs; on odd ones the first (the baseline)
    stays first and the rest are reversed."""
    return names if run % 2 == 0 else [names[0]] + names[1:][::-1]


def c1_metrics(name, w, ph):
    n = w["requests"]
    return {
        "c1_target": name,
        "c1_requests": n,
        "c1_p50_ms": w["p50_us"] / 1000.0,
        "c1_p99_ms": w["p99_us"] / 1000.0,
        "c1_cpu_us_per_req": per(ph["cpu_s"], n),
        # the proxy's context switches per request, all its threads (None for direct)
        "c1_vol_switches_per_req": per(ph.get("vol_switches"), n, scale=1),
        "c1_invol_switches_per_req": per(ph.get("invol_switches"), n, scale=1),
        "lost": wrk_lost(w),
        "other_cpu_pct": ph["other_cpu_pct"],
    }


def added_over_direct(results):
    """Each target's p50/p99 minus direct's in the same run (c1_added_*; not on direct)."""
    base = results.get("direct")
    for name, m in results.items():
        if base and name != "direct":
            m["c1_added_p50_ms"] = m["c1_p50_ms"] - base["c1_p50_ms"]
            m["c1_added_p99_ms"] = m["c1_p99_ms"] - base["c1_p99_ms"]


def c1_run(args, procs, tmp, run, names):
    """One run: each target started, warmed up 1 s, measured, stopped. Returns {name: metrics}."""
    order = alternate(names, run)
    log(f"run {run + 1}/{args.runs}: concurrency 1, {args.duration} s each: {', '.join(order)}")
    upstream, _ = start_upstream(procs, tmp, run)
    results = {}
    for name in order:
        target = C1_TARGETS[name](procs, tmp)
        target.start()
        try:
            settle(args)
            tag = f"r{run}-c1-{name}"
            run_wrk(procs, tmp, target.url, 1, 1, tag + "-warm")
            ph = Phase(target, upstream.pid)
            w = run_wrk(procs, tmp, target.url, args.duration, 1, tag)
            results[name] = c1_metrics(name, w, ph.end())
        finally:
            target.stop()
    procs.stop(upstream)
    added_over_direct(results)
    return results


def switches(a):
    """A target's context switches per request, "vol + invol", or "-"."""
    vol, invol = a.get("c1_vol_switches_per_req"), a.get("c1_invol_switches_per_req")
    if vol is None or invol is None:
        return "-"
    return f"{vol:.2f} + {invol:.2f}"


def c1_table(agg, names):
    rows = [["target", "requests", "p50 (ms)", "p99 (ms)", "added p50 (ms)", "added p99 (ms)", "CPU/req (us)",
             "switches/req vol + invol", "lost"]]
    for n in names:
        a = agg[n]
        f = lambda k, fmt: "-" if a.get(k) is None else fmt.format(a[k])  # noqa: E731
        rows.append([n, f("c1_requests", "{:.0f}"), f("c1_p50_ms", "{:.3f}"), f("c1_p99_ms", "{:.3f}"),
                     f("c1_added_p50_ms", "{:.3f}"), f("c1_added_p99_ms", "{:.3f}"), f("c1_cpu_us_per_req", "{:.1f}"),
                     switches(a), f("lost", "{:.0f}")])
    return format_table(rows)


def c1_main(args, procs, tmp, info):
    """Each target in turn (the order alternates between runs) takes `--duration` seconds of
    sequential requests from wrk on one kept-alive connection (-c1 -t1), the way most apps call an
    LLM. Added latency: its p50/p99 minus direct's in the same run."""
    names = [n for n in C1_TARGETS if n in args.c1_targets]
    runs_of = {n: [] for n in names}
    for run in range(args.runs):
        results = c1_run(args, procs, tmp, run, names)
        ts = now_ts()
        for name, m in results.items():
            runs_of[name].append(m)
            if args.results:
                append_result(args.results, info.record(ts=ts, run=run + 1, runs=args.runs, target=f"c1-{name}",
                                                        url=C1_TARGETS[name](procs, tmp).url, metrics=m))
    agg = {n: aggregate(runs_of[n]) for n in names}
    median = f", median of {args.runs}" if args.runs > 1 else ""
    print(info.headline(f"proxy on core {PROXY_CPU}, wrk+upstream on core {LOAD_CPU}; wrk -c1 -t1, "
                        f"{args.duration} s per target{median}"), flush=True)
    print(c1_table(agg, names), flush=True)
