"""The limits mode's numbers, checks and tables: rebound's CPU per request with a limit against
plain forwarding (one rebound, the in-memory counts), and what the limit costs Redis with three
replicas on one redis-server (rebound's own count of its Redis calls, from each replica's /metrics,
and Redis's CPU and commands)."""

import statistics

from .common import LIMIT_REDIS_OPS
from .loadgen import wrk_errors
from .prom import prom_by, prom_sum
from .redis_server import calls_of, redis_script_calls
from .render import format_table, metric_cell, metric_header
from .stats import per, ratio

LIMITS_CONFIGS = ("plain", "limits")
LIMIT_NAME = "team"  # the [limits.NAME] of bench/rebound.limits.bench.toml
ADDED_TARGET_US = 2.0  # issue 49 item 7: at most 2 us of CPU more per request than without limits


def limit_counts(samples):
    """What a replica's /metrics (or the change between two readings of it) says of its limit and
    its Redis calls: decisions, tokens, and per Redis op its calls and their seconds."""
    decisions = "rebound_limit_decisions_total"
    tokens = "rebound_limit_tokens_total"
    return {
        "admitted": prom_sum(samples, decisions, limit=LIMIT_NAME, result="admitted"),
        "queued": prom_sum(samples, decisions, limit=LIMIT_NAME, result="queued"),
        "rejected": prom_sum(samples, decisions, limit=LIMIT_NAME, result="rejected"),
        "tokens_reserved": prom_sum(samples, tokens, limit=LIMIT_NAME, kind="reserved"),
        "tokens_settled": prom_sum(samples, tokens, limit=LIMIT_NAME, kind="settled"),
        "redis_calls": prom_by(samples, "rebound_redis_command_duration_seconds_count", "op"),
        "redis_seconds": prom_by(samples, "rebound_redis_command_duration_seconds_sum", "op"),
    }


def limits_cpu_metrics(config, w, ph, received, counts):
    """One config's numbers (one rebound, no [redis]) from wrk's summary (WRK_LIMITS_LUA's
    counters), the phase's CPU, the upstream's count of its calls and the change in its /metrics
    over the load (limit_counts)."""
    cpu, sched = ph["cpu_s"], ph["sched_s"]
    n = w["requests"]
    m = {
        "limits_config": config,
        "limits_requests": n,
        "limits_sent": w["sent"],
        "limits_answered": w["answered"],
        "limits_rps": n / (w["duration_us"] / 1e6),
        "limits_cpu_s": cpu,
        "limits_cpu_us_per_req": per(cpu, n),
        "limits_sched_cpu_us_per_req": per(sched, n),
        "limits_proxy_core_util": None if cpu is None else cpu / ph["wall_s"],
        "limits_load_core_busy_pct": ph["core1_busy_pct"],
        "limits_p50_ms": w["p50_us"] / 1000.0,
        "limits_p99_ms": w["p99_us"] / 1000.0,
        "limits_errors": wrk_errors(w),
        "limits_non2xx": w["non2xx"],
        "limits_429": w["s429"],
        "limits_ratelimit_fields": w["ratelimit"],
        "limits_upstream_received": received,
        "limits_admitted": counts["admitted"],
        "limits_queued": counts["queued"],
        "limits_rejected": counts["rejected"],
        "limits_tokens_reserved_per_req": per(counts["tokens_reserved"], counts["admitted"], 1),
        "limits_tokens_settled_per_req": per(counts["tokens_settled"], counts["admitted"], 1),
        # every Redis call rebound made (none without [redis]: the counts are this process's)
        "limits_redis_calls": sum(counts["redis_calls"].values()),
        "limits_redis_calls_per_req": per(sum(counts["redis_calls"].values()), n, 1),
        "limits_other_cpu_pct": ph["other_cpu_pct"],
        "limits_steal_pct": ph["steal_pct"],
    }
    m["limits_lost"] = m["limits_errors"] + m["limits_non2xx"]
    # every answered request reached the upstream once (the ones wrk abandoned may have too)
    m["limits_one_call_per_request"] = int(received is not None and w["answered"] <= received <= w["sent"])
    return m


def limits_added(plain, limits):
    """What the limit adds to plain forwarding in one run, stored on the limits line: the CPU per
    request added (us), and limits/plain ratios."""
    out = {}
    for k in ("limits_cpu_us_per_req", "limits_sched_cpu_us_per_req"):
        a, b = limits.get(k), plain.get(k)
        out[k.replace("_per_req", "_added")] = None if a is None or b is None else a - b
    for k in ("limits_cpu_us_per_req", "limits_sched_cpu_us_per_req", "limits_rps", "limits_p50_ms", "limits_p99_ms"):
        out[k + "_over_plain"] = ratio(limits.get(k), plain.get(k))
    return out


def limits_cpu_problems(results):
    """What makes one run's CPU comparison wrong (the mode fails on any): lost requests, a 429 or a
    request held back, a limited answer without its RateLimit field (or a plain one with it), an
    admission count that is not the requests', a Redis call without Redis, a request that did not
    reach the upstream once."""
    out = []
    for config in LIMITS_CONFIGS:
        m = results[config]
        if m["limits_lost"] or m["limits_429"]:
            out.append(f"{config}: {m['limits_errors']} socket errors, {m['limits_non2xx']} responses not 2xx "
                       f"({m['limits_429']} of them 429)")
        if not m["limits_one_call_per_request"]:
            out.append(f"{config}: upstream calls {m['limits_upstream_received']} not within answered "
                       f"{m['limits_answered']} .. sent {m['limits_sent']}")
        if m["limits_redis_calls"]:
            out.append(f"{config}: {m['limits_redis_calls']:.0f} Redis calls counted in /metrics, with no [redis]")
    p, li = results["plain"], results["limits"]
    if p["limits_ratelimit_fields"] or p["limits_admitted"]:
        out.append(f"plain: {p['limits_ratelimit_fields']} responses with a RateLimit field, "
                   f"{p['limits_admitted']:.0f} admissions: the plain route has no limit")
    if li["limits_ratelimit_fields"] != li["limits_answered"]:
        out.append(f"limits: {li['limits_ratelimit_fields']} of {li['limits_answered']} responses with a "
                   f"RateLimit field (every admitted request's response has one)")
    if li["limits_rejected"] or li["limits_queued"]:
        out.append(f"limits: {li['limits_rejected']:.0f} requests refused, {li['limits_queued']:.0f} queued: "
                   f"the quotas of the bench config must hold nothing back")
    if not li["limits_answered"] <= li["limits_admitted"] <= li["limits_sent"]:
        out.append(f"limits: {li['limits_admitted']:.0f} admissions counted, not within answered "
                   f"{li['limits_answered']} .. sent {li['limits_sent']}")
    return out


def limits_fleet_metrics(ws, received, ph, idle, load, counts_load, counts_life):
    """The three replicas' numbers on one Redis. ws: wrk's summaries (WRK_LIMITS_LUA) in replica
    order, received: the upstream's count per replica, ph: the load's CPU accounting (the
    replicas summed), idle and load: redis_delta over the idle window and over the load,
    counts_load: limit_counts of each replica's /metrics change over the load, counts_life: the
    same from the replica's start (warm-up and the first leases included)."""
    n = sum(c["admitted"] for c in counts_load)
    n_life = sum(c["admitted"] for c in counts_life)
    idle_s, idle_d = idle
    window_s, load_d = load
    redis_cpu = sum(x["cpu_s"] for x in load_d.values())
    idle_cpu = sum(x["cpu_s"] for x in idle_d.values())
    cmds = {}
    for x in load_d.values():
        for c, s in x["cmds"].items():
            cmds[c] = cmds.get(c, 0) + s["calls"]
    scripts = sum(redis_script_calls(x["cmds"]) for x in load_d.values())
    script_usec = sum(s["usec"] for x in load_d.values() for c, s in x["cmds"].items() if c in ("evalsha", "eval"))
    answered = sum(w["answered"] for w in ws)
    m = {
        "limits_fleet_replicas": len(ws),
        "limits_fleet_requests": answered,
        "limits_fleet_sent": sum(w["sent"] for w in ws),
        "limits_fleet_upstream_received": sum(r or 0 for r in received),
        "limits_fleet_admitted": n,
        "limits_fleet_admitted_life": n_life,
        "limits_fleet_rps": answered / (max(w["duration_us"] for w in ws) / 1e6),
        "limits_fleet_p50_ms": statistics.median(w["p50_us"] for w in ws) / 1000.0,
        "limits_fleet_p99_ms": max(w["p99_us"] for w in ws) / 1000.0,
        "limits_fleet_errors": sum(wrk_errors(w) for w in ws),
        "limits_fleet_non2xx": sum(w["non2xx"] for w in ws),
        "limits_fleet_429": sum(w["s429"] for w in ws),
        "limits_fleet_ratelimit_fields": sum(w["ratelimit"] for w in ws),
        "limits_fleet_queued": sum(c["queued"] for c in counts_load),
        "limits_fleet_rejected": sum(c["rejected"] for c in counts_load),
        "limits_fleet_proxy_cpu_us_per_admitted": per(ph["cpu_s"], n),
        # rebound's own count of its Redis calls (every op), over the load
        "limits_fleet_redis_ops": {op: sum(c["redis_calls"].get(op, 0.0) for c in counts_load)
                                   for op in sorted({op for c in counts_load for op in c["redis_calls"]})},
        "limits_fleet_redis_calls_per_admitted": per(sum(sum(c["redis_calls"].values()) for c in counts_load), n, 1),
        # Redis's side over the load
        "limits_fleet_redis_window_s": window_s,
        "limits_fleet_redis_cpu_s": redis_cpu,
        "limits_fleet_redis_core_busy_pct": 100.0 * redis_cpu / window_s,
        "limits_fleet_redis_cpu_us_per_admitted": per(redis_cpu, n),
        "limits_fleet_redis_cpu_us_per_admitted_net": per(redis_cpu - idle_cpu / idle_s * window_s, n),
        "limits_fleet_redis_bg_cpu_pct": 100.0 * idle_cpu / idle_s,
        "limits_fleet_redis_bg_cmds_per_s": sum(calls_of(x["cmds"]) for x in idle_d.values()) / idle_s,
        "limits_fleet_redis_evalsha_per_admitted": per(scripts, n, 1),
        "limits_fleet_redis_commands_per_admitted": per(sum(cmds.values()), n, 1),
        "limits_fleet_redis_commands": dict(sorted(cmds.items())),
        "limits_fleet_redis_usec_per_script": per(script_usec, scripts, 1),
        "limits_fleet_other_cpu_pct": ph["other_cpu_pct"],
        "limits_fleet_steal_pct": ph["steal_pct"],
    }
    for op in LIMIT_REDIS_OPS:
        load_calls = [c["redis_calls"].get(op, 0.0) for c in counts_load]
        life_calls = [c["redis_calls"].get(op, 0.0) for c in counts_life]
        m[f"limits_fleet_{op}_calls"] = sum(load_calls)
        m[f"limits_fleet_{op}_per_admitted"] = per(sum(load_calls), n, 1)
        m[f"limits_fleet_{op}_calls_life"] = sum(life_calls)
        m[f"limits_fleet_{op}_per_admitted_life"] = per(sum(life_calls), n_life, 1)
        m[f"limits_fleet_{op}_calls_by_replica"] = load_calls
        m[f"limits_fleet_{op}_calls_by_replica_life"] = life_calls
        seconds = sum(c["redis_seconds"].get(op, 0.0) for c in counts_life)
        m[f"limits_fleet_{op}_ms_mean_life"] = per(seconds, sum(life_calls), 1e3)
    m["limits_fleet_lost"] = m["limits_fleet_errors"] + m["limits_fleet_non2xx"]
    return m


def limits_fleet_problems(ws, received, counts_load):
    """What makes the fleet phase wrong (the mode fails on any): per replica, lost requests, a 429,
    a request held back, an answer without its RateLimit field, upstream calls or admissions not
    within answered .. sent."""
    out = []
    for i, (w, got, c) in enumerate(zip(ws, received, counts_load)):
        lost = wrk_errors(w) + w["non2xx"]
        if lost or w["s429"]:
            out.append(f"replica {i}: {wrk_errors(w)} socket errors, {w['non2xx']} responses not 2xx "
                       f"({w['s429']} of them 429)")
        if got is None or not w["answered"] <= got <= w["sent"]:
            out.append(f"replica {i}: upstream calls {got} not within answered {w['answered']} .. sent {w['sent']}")
        if w["ratelimit"] != w["answered"]:
            out.append(f"replica {i}: {w['ratelimit']} of {w['answered']} responses with a RateLimit field")
        if c["rejected"] or c["queued"]:
            out.append(f"replica {i}: {c['rejected']:.0f} requests refused, {c['queued']:.0f} queued")
        if not w["answered"] <= c["admitted"] <= w["sent"]:
            out.append(f"replica {i}: {c['admitted']:.0f} admissions, not within answered {w['answered']} .. "
                       f"sent {w['sent']}")
    return out


LIMITS_ROWS = [
    ("throughput c=64 (req/s)", "limits_rps", "{:.0f}", 1),
    ("proxy CPU per request (us)", "limits_cpu_us_per_req", "{:.2f}", 1),
    ("  same, scheduler runtime (us)", "limits_sched_cpu_us_per_req", "{:.2f}", 1),
    ("proxy core busy (%)", "limits_proxy_core_util", "{:.0f}", 100),
    ("load+upstream core busy (%)", "limits_load_core_busy_pct", "{:.0f}", 1),
    ("wrk latency p50 (ms)", "limits_p50_ms", "{:.3f}", 1),
    ("wrk latency p99 (ms)", "limits_p99_ms", "{:.3f}", 1),
    ("requests answered", "limits_answered", "{:.0f}", 1),
    ("upstream calls", "limits_upstream_received", "{:.0f}", 1),
    ("admitted by the limit (/metrics)", "limits_admitted", "{:.0f}", 1),
    ("responses with RateLimit fields", "limits_ratelimit_fields", "{:.0f}", 1),
    ("tokens reserved per request", "limits_tokens_reserved_per_req", "{:.0f}", 1),
    ("tokens settled per request", "limits_tokens_settled_per_req", "{:.0f}", 1),
    ("Redis calls per request (/metrics)", "limits_redis_calls_per_req", "{:.0f}", 1),
    ("429s", "limits_429", "{:.0f}", 1),
    ("lost: errors+non-2xx", "limits_lost", "{:.0f}", 1),
    ("other processes' CPU (%)", "limits_other_cpu_pct", "{:.0f}", 1),
]
LIMITS_DIFF_KEYS = ("limits_cpu_us_per_req", "limits_sched_cpu_us_per_req", "limits_p50_ms", "limits_p99_ms")
LIMITS_RATIO_KEYS = ("limits_rps", "limits_cpu_us_per_req", "limits_sched_cpu_us_per_req", "limits_p50_ms",
                     "limits_p99_ms")


def limits_cpu_table(agg, runs):
    """plain and limits side by side, then limits - plain and limits / plain (of the medians)."""
    rows = [[metric_header(runs), "plain", "limits", "limits-plain", "limits/plain"]]
    for label, key, fmt, scale in LIMITS_ROWS:
        p, li = agg.get("plain", {}).get(key), agg.get("limits", {}).get(key)
        diff = f"{(li - p) * scale:+.2f}" if key in LIMITS_DIFF_KEYS and p is not None and li is not None else "-"
        rat = f"{li / p:.3f}" if key in LIMITS_RATIO_KEYS and li is not None and p else "-"
        rows.append([label, metric_cell(p, fmt, scale), metric_cell(li, fmt, scale), diff, rat])
    return format_table(rows)


def added_verdict(per_run_limits):
    """The line on issue 49's target: the CPU a request under a limit costs more than one without,
    as the median of the runs' differences (each run measures both), and whether it is at most
    ADDED_TARGET_US."""
    added = [m["limits_cpu_us_added"] for m in per_run_limits if m.get("limits_cpu_us_added") is not None]
    sched = [m["limits_sched_cpu_us_added"] for m in per_run_limits if m.get("limits_sched_cpu_us_added") is not None]
    if not added:
        return "CPU added per request by the limit: not measured"
    med = statistics.median(added)
    runs = ", ".join(f"{a:+.2f}" for a in added)
    sched_text = f"; scheduler runtime {statistics.median(sched):+.2f} us" if sched else ""
    verdict = "met" if med <= ADDED_TARGET_US else "NOT met"
    return (f"CPU added per request by the limit (limits - plain, same run): median {med:+.2f} us (per run "
            f"{runs}){sched_text}; target at most {ADDED_TARGET_US:.0f} us: {verdict}")


FLEET_ROWS = [
    ("requests admitted, 3 replicas", "limits_fleet_admitted", "{:.0f}", 1),
    ("throughput (req/s, all on this machine)", "limits_fleet_rps", "{:.0f}", 1),
    ("limit_lease calls per admitted request", "limits_fleet_limit_lease_per_admitted", "{:.6f}", 1),
    ("limit_slots calls per admitted request", "limits_fleet_limit_slots_per_admitted", "{:.6f}", 1),
    ("limit_adjust calls per admitted request", "limits_fleet_limit_adjust_per_admitted", "{:.6f}", 1),
    ("every Redis call per admitted request", "limits_fleet_redis_calls_per_admitted", "{:.6f}", 1),
    ("limit_lease calls, 3 replicas", "limits_fleet_limit_lease_calls", "{:.0f}", 1),
    ("limit_slots calls, 3 replicas", "limits_fleet_limit_slots_calls", "{:.0f}", 1),
    ("limit_adjust calls, 3 replicas", "limits_fleet_limit_adjust_calls", "{:.0f}", 1),
    ("over the replicas' life, warm-up included:", None, "", 1),
    ("  requests admitted", "limits_fleet_admitted_life", "{:.0f}", 1),
    ("  limit_lease calls per admitted request", "limits_fleet_limit_lease_per_admitted_life", "{:.6f}", 1),
    ("  limit_slots calls per admitted request", "limits_fleet_limit_slots_per_admitted_life", "{:.6f}", 1),
    ("  limit_adjust calls per admitted request", "limits_fleet_limit_adjust_per_admitted_life", "{:.6f}", 1),
    ("  limit_lease latency seen by rebound, mean (ms)", "limits_fleet_limit_lease_ms_mean_life", "{:.3f}", 1),
    ("Redis CPU per admitted request (us)", "limits_fleet_redis_cpu_us_per_admitted", "{:.3f}", 1),
    ("  same, idle background taken out (us)", "limits_fleet_redis_cpu_us_per_admitted_net", "{:.3f}", 1),
    ("Redis EVALSHA per admitted request", "limits_fleet_redis_evalsha_per_admitted", "{:.6f}", 1),
    ("Redis commands per admitted request, scripts' own too", "limits_fleet_redis_commands_per_admitted", "{:.6f}", 1),
    ("Redis time in a script call (us, commandstats)", "limits_fleet_redis_usec_per_script", "{:.1f}", 1),
    ("Redis busy under the load (% of a core)", "limits_fleet_redis_core_busy_pct", "{:.2f}", 1),
    ("Redis idle background, 3 replicas (% of a core)", "limits_fleet_redis_bg_cpu_pct", "{:.2f}", 1),
    ("  commands per second", "limits_fleet_redis_bg_cmds_per_s", "{:.1f}", 1),
    ("rebound CPU per admitted request, 3 replicas (us)", "limits_fleet_proxy_cpu_us_per_admitted", "{:.1f}", 1),
    ("wrk latency p50, median of the 3 (ms)", "limits_fleet_p50_ms", "{:.3f}", 1),
    ("wrk latency p99, worst of the 3 (ms)", "limits_fleet_p99_ms", "{:.3f}", 1),
    ("429s", "limits_fleet_429", "{:.0f}", 1),
    ("lost: errors+non-2xx", "limits_fleet_lost", "{:.0f}", 1),
    ("other processes' CPU (%)", "limits_fleet_other_cpu_pct", "{:.0f}", 1),
]


def limits_fleet_table(agg, runs):
    rows = [[metric_header(runs), "3 replicas, one Redis"]]
    for label, key, fmt, scale in FLEET_ROWS:
        rows.append([label, "" if key is None else metric_cell(agg.get(key), fmt, scale)])
    return format_table(rows)


def replica_calls_lines(per_run_fleet):
    """Per run, each replica's limit_lease / limit_slots / limit_adjust calls over the load and over
    its life."""
    out = []
    for run, m in enumerate(per_run_fleet, 1):
        cells = []
        for i in range(m["limits_fleet_replicas"]):
            load = "/".join(f"{m[f'limits_fleet_{op}_calls_by_replica'][i]:.0f}" for op in LIMIT_REDIS_OPS)
            life = "/".join(f"{m[f'limits_fleet_{op}_calls_by_replica_life'][i]:.0f}" for op in LIMIT_REDIS_OPS)
            cells.append(f"replica {i}: {load} ({life})")
        out.append(f"run {run}, limit_lease/limit_slots/limit_adjust calls over the load (over the life): "
                   + "; ".join(cells))
    return out


LIMITS_NOTE = (
    "\nCPU per request: utime+stime of the one rebound over the measured phase / requests answered; plain and "
    "limits alternate their order between runs.\nRedis calls: rebound_redis_command_duration_seconds_count by op, "
    "the change in each replica's /metrics over the load (and from its start), / the admissions counted in\n"
    "rebound_limit_decisions_total. A replica asks Redis for a lease of quota / (8 x replicas) per bucket, quota "
    "and window (its first, before it knows the\nreplicas: quota / 8); the request that finds it spent waits "
    "for the next (one round trip). A bucket used up to its quota costs about 8 x replicas\nlease calls per "
    "window, so "
    "8 x replicas / requests_per_minute calls per admitted request for the request quota (the same for tokens, "
    "in tokens per request);\nwith quotas far above the traffic, as here, one per bucket, quota, replica and "
    "window. Redis CPU: used_cpu_sys + used_cpu_user (INFO) over the load."
)
