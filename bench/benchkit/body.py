"""The body mode: request bodies from 1 KiB to 4 MiB, sequential POSTs on one kept-alive
connection to each target: latency, latency added over direct, and the proxy's CPU per request."""

from .c1 import alternate
from .common import LOAD_CPU, PROXY_CPU, log
from .loadgen import run_wrk, wrk_lost
from .lua import body_lua
from .phase import Phase, settle
from .procs import start_upstream
from .render import format_table
from .results import append_result, now_ts
from .stats import aggregate, per
from .targets import BODY_TARGET_CLASSES, BODY_TARGETS

BODY_SIZES = {"1KiB": 1 << 10, "256KiB": 256 << 10, "1MiB": 1 << 20, "4MiB": 4 << 20}


def body_metrics(w, ph):
    n = w["requests"]
    return {
        "body_requests": n,
        "body_p50_ms": w["p50_us"] / 1000.0,
        "body_p99_ms": w["p99_us"] / 1000.0,
        "body_cpu_us_per_req": per(ph["cpu_s"], n),
        "lost": wrk_lost(w),
        "other_cpu_pct": ph["other_cpu_pct"],
    }


def body_target(args, procs, tmp, run, name, upstream_pid, runs_of):
    """Every body size against one started target, each after a 1 s warm-up."""
    target = BODY_TARGET_CLASSES[name](procs, tmp)
    target.start()
    try:
        for size, nbytes in BODY_SIZES.items():
            settle(args)
            tag = f"r{run}-body-{name}-{size}"
            lua = body_lua(args.body_shape, nbytes, name == "rebound-keyed")
            run_wrk(procs, tmp, target.url, 1, 1, tag + "-warm", lua=lua)
            ph = Phase(target, upstream_pid)
            w = run_wrk(procs, tmp, target.url, args.duration, 1, tag, lua=lua)
            runs_of[(size, name)].append(body_metrics(w, ph.end()))
    finally:
        target.stop()


def body_aggregates(runs_of, names):
    """{(size, target): the median over runs, with body_added_p50_ms over direct's median}."""
    out = {}
    for size in BODY_SIZES:
        base = aggregate(runs_of[(size, "direct")]) if "direct" in names else {}
        for name in names:
            a = aggregate(runs_of[(size, name)])
            if base.get("body_p50_ms") is not None and name != "direct":
                a["body_added_p50_ms"] = a["body_p50_ms"] - base["body_p50_ms"]
            out[(size, name)] = a
    return out


def body_table(aggs):
    rows = [["body", "target", "requests", "p50 (ms)", "p99 (ms)", "added p50 (ms)", "CPU/req (us)", "lost"]]
    for (size, name), a in aggs.items():
        f = lambda k, fmt: "-" if a.get(k) is None else fmt.format(a[k])  # noqa: E731
        rows.append([size, name, f("body_requests", "{:.0f}"), f("body_p50_ms", "{:.3f}"), f("body_p99_ms", "{:.3f}"),
                     f("body_added_p50_ms", "{:.3f}"), f("body_cpu_us_per_req", "{:.1f}"), f("lost", "{:.0f}")])
    return format_table(rows, left=2)


def body_main(args, procs, tmp, info):
    """For each body size, each target in turn takes `--duration` seconds of sequential POSTs of
    that size on one kept-alive connection (wrk -c1 -t1): p50/p99, the latency added over direct,
    and the proxy's CPU per request. `rebound-keyed`: the idempotent route, a fresh
    Idempotency-Key per request."""
    names = [n for n in BODY_TARGETS if n in args.body_targets]
    runs_of = {(s, n): [] for s in BODY_SIZES for n in names}
    for run in range(args.runs):
        upstream, _ = start_upstream(procs, tmp, run)
        order = alternate(names, run)
        log(f"run {run + 1}/{args.runs}: bodies {', '.join(BODY_SIZES)}; {', '.join(order)}")
        for name in order:
            body_target(args, procs, tmp, run, name, upstream.pid, runs_of)
        procs.stop(upstream)
    median = f", median of {args.runs}" if args.runs > 1 else ""
    print(info.headline(f"proxy on core {PROXY_CPU}, wrk+upstream on core {LOAD_CPU}; wrk -c1 -t1, "
                        f"{args.duration} s per target and size{median}"), flush=True)
    aggs = body_aggregates(runs_of, names)
    if args.results:
        ts = now_ts()
        for (size, name), a in aggs.items():
            append_result(args.results, info.record(ts=ts, runs=args.runs, target=f"body-{size}-{name}",
                                                    metrics=dict(a, body_size=size, body_shape=args.body_shape)))
    print(body_table(aggs), flush=True)
