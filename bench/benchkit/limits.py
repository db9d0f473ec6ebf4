"""The limits mode: what a fleet-wide limit (`[limits.team]`, every quota far above the load) costs a
request against plain forwarding, and what it costs Redis with three replicas on one redis-server.
limits_report.py turns the readings into numbers."""

import time
from concurrent.futures import ThreadPoolExecutor

from .common import (
    FLEET_IDLE_S, FLEET_REPLICAS, FLEET_URLS, LIMITS_TEAMS, LOAD_CPU, PROXY_CPU, REBOUND_CONFIG,
    REBOUND_LIMITS_CONFIG, URLS, BenchError, log,
)
from .fleet import Fleet, ReboundReplica, fleet_config_text, log_problems, start_fleet_redis
from .limits_report import (
    LIMITS_CONFIGS, LIMITS_NOTE, added_verdict, limit_counts, limits_added, limits_cpu_metrics,
    limits_cpu_problems, limits_cpu_table, limits_fleet_metrics, limits_fleet_problems, limits_fleet_table,
    replica_calls_lines,
)
from .loadgen import run_wrk
from .lua import limits_lua
from .net import upstream_count
from .phase import Phase, settle
from .procs import check_upstream, start_upstream
from .prom import prom_delta, read_metrics
from .redis_server import redis_delta, redis_snapshot
from .render import print_appended, print_noise_warning
from .results import append_result, now_ts
from .stats import aggregate
from .targets import Rebound
from .tools import rebound_check

LUA = limits_lua(LIMITS_TEAMS)


class ReboundLimits(Rebound):
    """rebound with [limits.team] on its route, no [redis]: the limit's counts are this process's."""

    name = "rebound"
    config = REBOUND_LIMITS_CONFIG


def measure_cpu_config(args, procs, tmp, config, tag, upstream_pid):
    """One config on a fresh rebound: warm-up, then the measured wrk phase; its /metrics read
    around it. Returns its metrics."""
    target = (ReboundLimits if config == "limits" else Rebound)(procs, tmp)
    target.start()
    try:
        url = target.url
        if args.warmup > 0:
            run_wrk(procs, tmp, url, args.warmup, args.connections, f"{tag}-warmup", lua=LUA)
        settle(args)
        log(f"  {config}: c={args.connections}, {args.duration} s, x-team {'/'.join(LIMITS_TEAMS)} in turn (wrk)")
        before = read_metrics(target.admin_port)
        ph = Phase(target, upstream_pid)
        w = run_wrk(procs, tmp, url, args.duration, args.connections, tag, lua=LUA)
        ph = ph.end()
        time.sleep(0.3)  # the requests wrk abandoned at its stop reach the upstream (or not)
        counts = limit_counts(prom_delta(before, read_metrics(target.admin_port)))
        received = upstream_count(tag)
    finally:
        target.stop()
    return limits_cpu_metrics(config, w, ph, received, counts)


def cpu_run(args, procs, tmp, run, upstream_pid):
    """Both configs in turn (the order alternates between runs), then what the limit added."""
    order = list(LIMITS_CONFIGS) if run % 2 == 0 else list(reversed(LIMITS_CONFIGS))
    log(f"run {run + 1}/{args.runs}: a limit vs plain forwarding, one rebound, order {', '.join(order)}")
    results = {}
    for config in order:
        results[config] = measure_cpu_config(args, procs, tmp, config, f"r{run}-limits-{config}", upstream_pid)
    problems = limits_cpu_problems(results)
    if problems:
        raise BenchError(f"run {run + 1}: " + "; ".join(problems))
    results["limits"].update(limits_added(results["plain"], results["limits"]))
    return results


def replica_config(d, index, redis_table):
    """bench/rebound.limits.bench.toml on replica `index`'s ports, plus a [redis] table: the limit's
    counts on the fleet's Redis. Checked with `rebound check`."""
    text = fleet_config_text(REBOUND_LIMITS_CONFIG.read_text(), index, redis_table, source=REBOUND_LIMITS_CONFIG,
                             mode="limits", what="the limit's counts on the fleet's Redis")
    path = d / f"rebound-{index}.toml"
    path.write_text(text)
    rebound_check(path)
    return path


def fleet_load(procs, d, replicas, seconds, connections, key):
    """wrk on every replica at once (one each, -t1 -c`connections`, WRK_LIMITS_LUA; replica i's
    requests carry x-fake-key `key`-i). Returns their summaries in replica order."""
    ex = ThreadPoolExecutor(len(replicas))
    try:
        futures = [ex.submit(run_wrk, procs, d, r.url, seconds, connections, f"{key}-{i}", LUA)
                   for i, r in enumerate(replicas)]
        return [f.result() for f in futures]
    finally:
        ex.shutdown(wait=False)  # on Ctrl-C, stop_all ends the wrk processes (and so the threads)


def measure_fleet(args, procs, tmp, tag, upstream_pid):
    """Three fresh replicas on a fresh redis-server: warm-up, the Redis's idle background over
    FLEET_IDLE_S, then `--duration` s of load on the three at once; every replica's /metrics read
    before and after it. Returns (metrics, warnings)."""
    d = tmp / tag
    d.mkdir()
    redis, ports, table = start_fleet_redis(procs, d, "single")
    replicas = []
    try:
        for i in range(len(FLEET_REPLICAS)):
            replicas.append(ReboundReplica(procs, d, i, replica_config(d, i, table)))
            replicas[-1].start()
        if args.warmup > 0:
            fleet_load(procs, d, replicas, args.warmup, args.fleet_connections, f"{tag}-warmup")
        settle(args)
        s0 = redis_snapshot(ports)
        time.sleep(FLEET_IDLE_S)
        idle = redis_delta(s0, redis_snapshot(ports))
        log(f"  fleet: {len(replicas)} replicas on one Redis, {args.duration} s, wrk -c{args.fleet_connections} "
            f"each, x-team {'/'.join(LIMITS_TEAMS)} in turn")
        before = [read_metrics(r.admin_port) for r in replicas]
        # redis-server is part of the benchmark: its CPU is not another process's noise
        ph = Phase(Fleet(replicas), upstream_pid, [p.pid for p in redis])
        s0 = redis_snapshot(ports)
        ws = fleet_load(procs, d, replicas, args.duration, args.fleet_connections, tag)
        ph = ph.end()
        time.sleep(0.3)  # the requests wrk abandoned at its stop complete, and are settled
        load = redis_delta(s0, redis_snapshot(ports))
        after = [read_metrics(r.admin_port) for r in replicas]
        received = [upstream_count(f"{tag}-{i}") for i in range(len(replicas))]
    finally:
        for r in replicas:
            r.stop()
        for p in redis:
            procs.stop(p)
    counts_load = [limit_counts(prom_delta(b, a)) for b, a in zip(before, after)]
    counts_life = [limit_counts(a) for a in after]
    problems = limits_fleet_problems(ws, received, counts_load)
    if problems:
        raise BenchError(f"{tag}: " + "; ".join(problems))
    logs = [(r.log_name, log_problems(d / r.log_name)) for r in replicas]
    warnings = [f"{name}: {len(lines)} WARN/ERROR log line(s), first: {lines[0][:300]}" for name, lines in logs if lines]
    return limits_fleet_metrics(ws, received, ph, idle, load, counts_load, counts_life), warnings


def limits_main(args, procs, tmp, info):
    """Each run: plain and limits on one rebound (the CPU a request costs), then three replicas
    with the limit on one Redis (what it costs Redis)."""
    per_config = {c: [] for c in LIMITS_CONFIGS}
    per_fleet = []
    warnings = []
    for run in range(args.runs):
        upstream, up_log = start_upstream(procs, tmp, run)
        results = cpu_run(args, procs, tmp, run, upstream.pid)
        check_upstream(upstream, up_log)
        ts = now_ts()
        for config in LIMITS_CONFIGS:
            per_config[config].append(results[config])
            if args.results:
                append_result(args.results, info.record(ts=ts, run=run + 1, runs=args.runs, mode="limits",
                                                        target=f"rebound-{config}", url=URLS["rebound"],
                                                        metrics=results[config]))
        log(f"run {run + 1}/{args.runs}: {len(FLEET_REPLICAS)} replicas with the limit on one Redis")
        fleet, warn = measure_fleet(args, procs, tmp, f"r{run}-limits-fleet", upstream.pid)
        check_upstream(upstream, up_log)
        procs.stop(upstream)
        warnings += [f"run {run + 1}: {w}" for w in warn]
        per_fleet.append(fleet)
        if args.results:
            append_result(args.results, info.record(ts=now_ts(), run=run + 1, runs=args.runs, mode="limits",
                                                    target="fleet-limits-single", url=FLEET_URLS, metrics=fleet))
        if args.runs > 1:
            print(f"\nrun {run + 1}/{args.runs}:", flush=True)
            print(limits_cpu_table({c: per_config[c][-1] for c in LIMITS_CONFIGS}, 1), flush=True)
    agg = {c: aggregate(per_config[c]) for c in LIMITS_CONFIGS}
    print(info.headline(f"rebound on core {PROXY_CPU}, wrk+upstream (and Redis) on core {LOAD_CPU}; plain: "
                        f"{REBOUND_CONFIG.name}, limits: {REBOUND_LIMITS_CONFIG.name} (no [redis]); "
                        f"x-team {'/'.join(LIMITS_TEAMS)} in turn"), flush=True)
    print(limits_cpu_table(agg, args.runs), flush=True)
    print("\n" + added_verdict(per_config["limits"]), flush=True)
    print(f"\n{len(FLEET_REPLICAS)} replicas of {REBOUND_LIMITS_CONFIG.name} + [redis] on one redis-server, "
          f"wrk -c{args.fleet_connections} each, {args.duration} s:", flush=True)
    fleet_agg = aggregate(per_fleet)
    print(limits_fleet_table(fleet_agg, args.runs), flush=True)
    for line in replica_calls_lines(per_fleet):
        print(line, flush=True)
    print(LIMITS_NOTE, flush=True)
    for w in warnings:
        print(f"WARNING: {w}", flush=True)
    print_noise_warning(list(agg.values()), key="limits_other_cpu_pct")
    print_noise_warning([fleet_agg], key="limits_fleet_other_cpu_pct")
    print_appended(args.results, 3 * args.runs)
