"""The cache mode: one request mix through rebound without and with its response cache."""

import json

from .common import (
    CACHE_HOT, CACHE_REDIS_PORT, HOST, LOAD_CPU, PROXY_CPU, REBOUND_CACHE_CONFIG, URLS, log,
)
from .loadgen import run_wrk, wrk_lost
from .lua import cache_lua
from .net import http_request, upstream_count
from .phase import Phase, settle
from .procs import start_upstream
from .redis_server import redis_cli, redis_commands, start_redis
from .render import columns_table, metric_header, print_appended
from .results import append_result, now_ts
from .stats import aggregate, per
from .targets import Rebound, ReboundCache

PHASES = ("uncached", "cached")


def cache_redis_config(tmp):
    """The cached config with a [redis] table pointing at the harness's redis-server."""
    config = tmp / "rebound.cache.redis.toml"
    config.write_text(REBOUND_CACHE_CONFIG.read_text() + f'\n[redis]\nurl = "redis://{HOST}:{CACHE_REDIS_PORT}/0"\n')
    return config


def phase_order(run_tag, first, second):
    """Both phases, in the given order on even runs (tag ending in an even digit), else reversed."""
    return [first, second] if run_tag.endswith(("0", "2", "4", "6", "8")) else [second, first]


def cache_metrics(args, phase, w, ph, received, redis_per_req, scripts_per_req):
    """One phase's numbers from wrk's summary, the phase's CPU, the upstream's count of its calls
    and, with Redis, the commands and script calls per request."""
    n = w["requests"]
    return {
        "cache_phase": phase,
        "cache_store": args.cache_store if phase == "cached" else None,
        "cache_hit_ratio_asked": args.hit_ratio,
        "cache_requests": n,
        "cache_upstream_received": received,
        "cache_hit_ratio_seen": 1 - received / n if n else None,
        "cache_cpu_us_per_req": per(ph["cpu_s"], n),
        "cache_sched_cpu_us_per_req": per(ph["sched_s"], n),
        "cache_rps": n / ph["wall_s"] if ph["wall_s"] else None,
        "cache_p50_ms": w["p50_us"] / 1000.0,
        "cache_p99_ms": w["p99_us"] / 1000.0,
        "cache_redis_cmds_per_req": redis_per_req,
        "cache_redis_round_trips_per_req": scripts_per_req,
        "lost": wrk_lost(w),
        "other_cpu_pct": ph["other_cpu_pct"],
    }


def cache_phase(args, procs, tmp, target, phase, tag, upstream_pid):
    """One phase on a started rebound: the hot set stored first when cached, then the measured mix."""
    url = URLS["rebound"]
    if phase == "cached":
        for i in range(CACHE_HOT):
            body = json.dumps({"model": "m", "hot": i}, separators=(",", ":")).encode()
            http_request("POST", url, body, {"content-type": "application/json", "x-fake-key": tag + "-warm"})
    settle(args)
    log(f"  {phase}: {args.duration} s, c={args.connections}, hit ratio {args.hit_ratio} "
        f"({CACHE_HOT} hot requests), store {args.cache_store if phase == 'cached' else '-'}")
    lua = cache_lua(tag, args.hit_ratio, CACHE_HOT)
    redis0 = redis_commands(CACHE_REDIS_PORT) if args.cache_store == "redis" and phase == "cached" else None
    # redis-server is part of the benchmark: its CPU is not another process's noise
    ph = Phase(target, upstream_pid, [args.redis_pid] if args.redis_pid else None)
    w = run_wrk(procs, tmp, url, args.duration, args.connections, tag, lua=lua)
    ph = ph.end()
    n = w["requests"]
    received = upstream_count(tag) or 0
    redis_per_req = scripts_per_req = None
    if redis0 is not None and n:
        total, scripts = redis_commands(CACHE_REDIS_PORT)
        redis_per_req, scripts_per_req = (total - redis0[0]) / n, (scripts - redis0[1]) / n
    return cache_metrics(args, phase, w, ph, received, redis_per_req, scripts_per_req)


def measure_cache(args, procs, tmp, run_tag, upstream_pid):
    """One run: the request mix (a fraction `--hit-ratio` from a hot set of CACHE_HOT requests,
    the rest each new) through rebound without a cache (`uncached`) and with it (`cached`, the hot
    set stored first). Returns {phase: metrics}."""
    out = {}
    config = REBOUND_CACHE_CONFIG
    if args.cache_store == "redis":
        config = cache_redis_config(tmp)
    for phase in phase_order(run_tag, "uncached", "cached"):
        target = (Rebound if phase == "uncached" else ReboundCache)(procs, tmp)
        if phase == "cached":
            target.config = config
        target.start()
        try:
            out[phase] = cache_phase(args, procs, tmp, target, phase, f"{run_tag}-cache-{phase}", upstream_pid)
        finally:
            target.stop()
    return out


CACHE_ROWS = [
    ("requests measured", "cache_requests", "{:.0f}", 1),
    ("hit ratio seen (1 - upstream calls / requests)", "cache_hit_ratio_seen", "{:.3f}", 1),
    ("proxy CPU per request (us)", "cache_cpu_us_per_req", "{:.1f}", 1),
    ("  same, scheduler runtime (us)", "cache_sched_cpu_us_per_req", "{:.1f}", 1),
    ("throughput (req/s)", "cache_rps", "{:.0f}", 1),
    ("wrk latency p50 (ms)", "cache_p50_ms", "{:.3f}", 1),
    ("wrk latency p99 (ms)", "cache_p99_ms", "{:.3f}", 1),
    ("Redis round trips per request (EVALSHA)", "cache_redis_round_trips_per_req", "{:.2f}", 1),
    ("  Redis commands per request, scripts' own too", "cache_redis_cmds_per_req", "{:.2f}", 1),
    ("lost: errors+non-2xx", "lost", "{:.0f}", 1),
    ("other processes' CPU, worst phase (%)", "other_cpu_pct", "{:.0f}", 1),
]
CACHE_RATIO_KEYS = ("cache_cpu_us_per_req", "cache_sched_cpu_us_per_req", "cache_rps", "cache_p50_ms", "cache_p99_ms")


def cache_table(agg, runs):
    header = [metric_header(runs), "no cache", "cache", "cache/none"]
    return columns_table(header, CACHE_ROWS, agg, PHASES, ("cache/none", "cached", "uncached", CACHE_RATIO_KEYS))


def cache_main(args, procs, tmp, info):
    per_phase = {"uncached": [], "cached": []}
    redis = None
    args.redis_pid = None
    if args.cache_store == "redis":
        redis = start_redis(procs, tmp, CACHE_REDIS_PORT)
        args.redis_pid = redis.pid
    try:
        for run in range(args.runs):
            log(f"run {run + 1}/{args.runs}: response cache, hit ratio {args.hit_ratio}, store {args.cache_store}")
            upstream, _ = start_upstream(procs, tmp, run)
            if redis is not None:
                redis_cli(CACHE_REDIS_PORT, "flushall")
            results = measure_cache(args, procs, tmp, f"r{run}", upstream.pid)
            procs.stop(upstream)
            ts = now_ts()
            for phase in PHASES:
                per_phase[phase].append(results[phase])
                if args.results:
                    append_result(args.results, info.record(ts=ts, run=run + 1, runs=args.runs,
                                                            target=f"rebound-cache-{phase}", url=URLS["rebound"],
                                                            metrics=results[phase]))
    finally:
        if redis is not None:
            procs.stop(redis)
    agg = {ph: aggregate(per_phase[ph]) for ph in per_phase}
    print(info.headline(f"rebound on core {PROXY_CPU}, wrk+upstream{'+redis' if redis else ''} on core "
                        f"{LOAD_CPU}; {args.hit_ratio:.0%} of requests from {CACHE_HOT} hot ones, the rest each new; "
                        f"cache store {args.cache_store}"), flush=True)
    print(cache_table(agg, args.runs), flush=True)
    print_appended(args.results, 2 * args.runs)
