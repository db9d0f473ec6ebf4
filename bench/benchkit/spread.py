"""The spread mode: each target allowed on both cores takes wrk's load on many connections (64)
and on a few long-lived ones (4, as an SDK's pool holds): requests per second, the proxy's CPU
per request, its context switches per request, and the share of its CPU each of its threads took
(a runtime that keeps a connection on one thread must still spread a few connections over the
cores)."""

from .common import log
from .loadgen import run_wrk, wrk_lost
from .phase import Phase, settle
from .procs import start_upstream
from .procstat import proc_cpu_s
from .render import format_table
from .results import append_result, now_ts
from .stats import aggregate, per
from .targets import C1_TARGETS

import os


def thread_cpu(pids):
    """{thread id: utime+stime seconds} of every live thread of `pids`."""
    out = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                out[tid] = proc_cpu_s(f"{pid}/task/{tid}")
            except OSError:
                pass
    return out


def busiest_share(before, after):
    """The busiest thread's share of the CPU the threads used between two thread_cpu readings
    (1.0: one thread did everything; 0.5 on two threads: an even split)."""
    used = [after[t] - before.get(t, 0.0) for t in after]
    total = sum(used)
    return None if total <= 0 else max(used) / total


def spread_metrics(name, conns, w, ph, share):
    n = w["requests"]
    return {
        "spread_target": name,
        "spread_connections": conns,
        "spread_rps": n / (w["duration_us"] / 1e6) if w["duration_us"] else None,
        "spread_cpu_us_per_req": per(ph["cpu_s"], n),
        "spread_switches_per_req": per((ph.get("vol_switches") or 0) + (ph.get("invol_switches") or 0), n, scale=1),
        "spread_busiest_thread_share": share,
        "lost": wrk_lost(w),
        "other_cpu_pct": ph["other_cpu_pct"],
    }


def spread_run(args, procs, tmp, run, names, conns_list):
    upstream, _ = start_upstream(procs, tmp, run)
    results = {}
    for name in names if run % 2 == 0 else names[::-1]:
        target = C1_TARGETS[name](procs, tmp)
        target.start()
        try:
            for conns in conns_list:
                settle(args)
                tag = f"r{run}-spread-{name}-c{conns}"
                run_wrk(procs, tmp, target.url, 1, conns, tag + "-warm")
                before = thread_cpu(target.pids())
                ph = Phase(target, upstream.pid)
                w = run_wrk(procs, tmp, target.url, args.duration, conns, tag)
                d = ph.end()
                share = busiest_share(before, thread_cpu(target.pids()))
                results[(name, conns)] = spread_metrics(name, conns, w, d, share)
        finally:
            target.stop()
    procs.stop(upstream)
    return results


def spread_main(args, procs, tmp, info):
    names = [n for n in C1_TARGETS if n in args.spread_targets]
    conns_list = [int(c) for c in args.spread_connections.split(",") if c]
    runs_of = {}
    for run in range(args.runs):
        log(f"run {run + 1}/{args.runs}: {', '.join(names)} on both cores, wrk -c{'/-c'.join(map(str, conns_list))}")
        ts = now_ts()
        for key, m in spread_run(args, procs, tmp, run, names, conns_list).items():
            runs_of.setdefault(key, []).append(m)
            if args.results:
                append_result(args.results, info.record(ts=ts, run=run + 1, runs=args.runs,
                                                        target=f"spread-{key[0]}-c{key[1]}", metrics=m))
    rows = [["target", "connections", "req/s", "CPU/req (us)", "switches/req", "busiest thread's share", "lost"]]
    for (name, conns), ms in runs_of.items():
        a = aggregate(ms)
        f = lambda k, fmt: "-" if a.get(k) is None else fmt.format(a[k])  # noqa: E731
        rows.append([name, str(conns), f("spread_rps", "{:.0f}"), f("spread_cpu_us_per_req", "{:.1f}"),
                     f("spread_switches_per_req", "{:.2f}"), f("spread_busiest_thread_share", "{:.2f}"),
                     f("lost", "{:.0f}")])
    median = f", median of {args.runs}" if args.runs > 1 else ""
    print(info.headline(f"targets on both cores, wrk and the upstream on one; wrk -t1, {args.duration} s{median}"),
          flush=True)
    print(format_table(rows), flush=True)
