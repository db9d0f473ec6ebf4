"""The policy mode: what the retry, breaker and idempotency policies cost per request against
plain forwarding, and a check that each request reached the upstream exactly once."""

import time

from .common import LOAD_CPU, PROXY_CPU, REBOUND_CONFIG, REBOUND_POLICY_CONFIG, URLS, log
from .loadgen import run_wrk, wrk_errors
from .lua import WRK_KEYED_LUA
from .net import upstream_count
from .phase import Phase, settle
from .procs import check_upstream, start_upstream
from .render import columns_table, metric_header, print_appended, print_noise_warning
from .results import append_result, now_ts
from .stats import aggregate, per, ratio
from .targets import Rebound, ReboundPolicy

POLICY_CONFIGS = ("plain", "policy")


def policy_metrics(config, w, ph, received, rss):
    """One config's numbers from wrk's summary (WRK_KEYED_LUA's counters), the phase's CPU, the
    upstream's count of its calls and the proxy's RSS at the end."""
    cpu, sched = ph["cpu_s"], ph["sched_s"]
    n = w["requests"]
    m = {
        "policy_config": config,
        "policy_requests": n,
        "policy_sent": w["sent"],
        "policy_answered": w["answered"],
        "policy_abandoned": w["sent"] - w["answered"],
        "policy_rps": n / (w["duration_us"] / 1e6),
        "policy_cpu_s": cpu,
        "policy_cpu_us_per_req": per(cpu, n),
        "policy_sched_cpu_us_per_req": per(sched, n),
        "policy_proxy_core_util": None if cpu is None else cpu / ph["wall_s"],
        "policy_load_core_busy_pct": ph["core1_busy_pct"],
        "policy_p50_ms": w["p50_us"] / 1000.0,
        "policy_p99_ms": w["p99_us"] / 1000.0,
        "policy_errors": wrk_errors(w),
        "policy_non2xx": w["non2xx"],
        "policy_attempts_not_1": w["attempts_other"],
        "policy_attempts_missing": w["attempts_missing"],
        "policy_upstream_received": received,
        # upstream calls beyond the answered requests: at most the abandoned ones may have arrived
        "policy_upstream_extra": None if received is None else received - w["answered"],
        "policy_rss_end_kib": rss,
        "policy_other_cpu_pct": ph["other_cpu_pct"],
        "policy_steal_pct": ph["steal_pct"],
    }
    # exactly one upstream call per request: every answered request reached the upstream once
    # (answered <= upstream calls), none twice beyond what the abandoned ones explain
    # (upstream calls <= sent), and rebound reports a single attempt for each one it answered
    m["policy_one_call_per_request"] = int(
        received is not None and w["answered"] <= received <= w["sent"] and w["attempts_other"] == 0
    )
    m["policy_lost"] = m["policy_errors"] + m["policy_non2xx"]
    return m


def measure_policy_config(args, procs, tmp, config, tag, upstream_pid):
    """One config on a fresh rebound: warm-up, then the measured wrk phase. Returns its metrics."""
    target = (ReboundPolicy if config == "policy" else Rebound)(procs, tmp)
    target.start()
    try:
        url = target.url
        if args.warmup > 0:
            run_wrk(procs, tmp, url, args.warmup, args.connections, f"{tag}-warmup", lua=WRK_KEYED_LUA)
        settle(args)
        log(f"  {config}: c={args.connections}, {args.duration} s, a fresh Idempotency-Key per request (wrk)")
        ph = Phase(target, upstream_pid)
        w = run_wrk(procs, tmp, url, args.duration, args.connections, tag, lua=WRK_KEYED_LUA)
        ph = ph.end()
        time.sleep(0.3)  # the requests wrk abandoned at its stop reach the upstream (or not)
        received = upstream_count(tag)
        rss = target.mem("VmRSS")
    finally:
        target.stop()
    return policy_metrics(config, w, ph, received, rss)


def policy_ratios(plain, policy):
    """policy/plain ratios, stored on the policy line."""
    out = {}
    for k in ("policy_cpu_us_per_req", "policy_sched_cpu_us_per_req", "policy_rps", "policy_p50_ms", "policy_p99_ms"):
        out[k + "_over_plain"] = ratio(policy.get(k), plain.get(k))
    return out


POLICY_ROWS = [
    ("throughput c=64 (req/s)", "policy_rps", "{:.0f}", 1),
    ("proxy CPU per request (us)", "policy_cpu_us_per_req", "{:.1f}", 1),
    ("  same, scheduler runtime (us)", "policy_sched_cpu_us_per_req", "{:.1f}", 1),
    ("proxy core busy (%)", "policy_proxy_core_util", "{:.0f}", 100),
    ("load+upstream core busy (%)", "policy_load_core_busy_pct", "{:.0f}", 1),
    ("wrk latency p50 (ms)", "policy_p50_ms", "{:.3f}", 1),
    ("wrk latency p99 (ms)", "policy_p99_ms", "{:.3f}", 1),
    ("requests answered", "policy_answered", "{:.0f}", 1),
    ("upstream calls", "policy_upstream_received", "{:.0f}", 1),
    ("  minus answered (<= abandoned)", "policy_upstream_extra", "{:.0f}", 1),
    ("  abandoned by wrk at its stop", "policy_abandoned", "{:.0f}", 1),
    ("responses with x-rebound-attempts != 1", "policy_attempts_not_1", "{:.0f}", 1),
    ("lost: errors+non-2xx", "policy_lost", "{:.0f}", 1),
    ("other processes' CPU (%)", "policy_other_cpu_pct", "{:.0f}", 1),
]
POLICY_RATIO_KEYS = ("policy_rps", "policy_cpu_us_per_req", "policy_sched_cpu_us_per_req", "policy_p50_ms", "policy_p99_ms")


def policy_checks(results):
    """Warnings about one run's results (empty when everything checks)."""
    out = []
    for config in POLICY_CONFIGS:
        m = results[config]
        if m["policy_lost"]:
            out.append(f"{config}: {m['policy_errors']} socket errors, {m['policy_non2xx']} responses not 2xx")
    p = results["policy"]
    if not p["policy_one_call_per_request"]:
        out.append(
            f"policy: upstream calls {p['policy_upstream_received']} not within answered {p['policy_answered']} .. "
            f"sent {p['policy_sent']}, or {p['policy_attempts_not_1']} responses with x-rebound-attempts != 1"
        )
    return out


def policy_table(agg, runs):
    header = [metric_header(runs), "plain", "policy", "policy/plain"]
    return columns_table(header, POLICY_ROWS, agg, POLICY_CONFIGS, ("policy/plain", "policy", "plain", POLICY_RATIO_KEYS))


def print_policy_table(agg, runs):
    print(policy_table(agg, runs), flush=True)


def policy_run(args, procs, tmp, run):
    """One run: both configs in turn (the order alternates between runs), then the ratios."""
    order = list(POLICY_CONFIGS) if run % 2 == 0 else list(reversed(POLICY_CONFIGS))
    log(f"run {run + 1}/{args.runs}: policy vs plain forwarding, order {', '.join(order)}")
    upstream, up_log = start_upstream(procs, tmp, run)
    results = {}
    for config in order:
        results[config] = measure_policy_config(args, procs, tmp, config, f"r{run}-policy-{config}", upstream.pid)
        check_upstream(upstream, up_log)
    procs.stop(upstream)
    results["policy"].update(policy_ratios(results["plain"], results["policy"]))
    return results


def policy_main(args, procs, tmp, info):
    per_config = {c: [] for c in POLICY_CONFIGS}
    warnings = []
    for run in range(args.runs):
        results = policy_run(args, procs, tmp, run)
        for w in policy_checks(results):
            warnings.append(f"run {run + 1}: {w}")
        ts = now_ts()
        for config in POLICY_CONFIGS:
            per_config[config].append(results[config])
            if args.results:
                append_result(args.results, info.record(ts=ts, run=run + 1, runs=args.runs, target=f"rebound-{config}",
                                                        url=URLS["rebound"], metrics=results[config]))
        if args.runs > 1:
            print(f"\nrun {run + 1}/{args.runs}:", flush=True)
            print_policy_table({c: per_config[c][-1] for c in POLICY_CONFIGS}, 1)
    agg = {c: aggregate(per_config[c]) for c in POLICY_CONFIGS}
    print(info.headline(f"rebound on core {PROXY_CPU}, wrk+upstream on core {LOAD_CPU}; "
                        f"plain: {REBOUND_CONFIG.name}, policy: {REBOUND_POLICY_CONFIG.name}; a fresh Idempotency-Key "
                        f"per request"), flush=True)
    print_policy_table(agg, args.runs)
    ok_runs = sum(m["policy_one_call_per_request"] for m in per_config["policy"])
    print(f"\npolicy config, one upstream call per request (answered <= upstream calls <= sent, every "
          f"x-rebound-attempts = 1): {ok_runs}/{args.runs} run(s) ok", flush=True)
    for w in warnings:
        print(f"WARNING: {w}", flush=True)
    print_noise_warning(agg.values(), key="policy_other_cpu_pct")
    print_appended(args.results, 2 * args.runs)
