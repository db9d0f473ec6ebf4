"""The command line: every option, its defaults and bounds, what each mode implies, and the knobs
recorded with every result line."""

import argparse
import sys

from .common import (
    ALL_TARGETS, DEFAULT_TARGETS, FLEET_IDLE_S, FLEET_MASTERS, FLEET_REPLICAS, FLEET_TOPOLOGIES, CACHE_HOT,
    IDEM_MAX_ENTRIES, LIMITS_TEAMS, LOAD_CPU, PROXY_CPU, REBOUND_CONFIG, REBOUND_IDEM_CONFIG, REBOUND_LIMITS_CONFIG,
    REBOUND_POLICY_CONFIG, ROOT, BENCH,
)
from .brownout_provider import parse_phases
from .targets import BODY_TARGETS, C1_TARGETS

MODES = ["forward", "idempotency", "follow", "policy", "scale", "cache", "c1", "spread", "body", "fleet", "limits",
         "brownout"]


def build_parser(description=None):
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hit-ratio", type=float, default=0.9, help="cache mode: share of requests from the hot set (default 0.9)")
    ap.add_argument("--cache-store", choices=["memory", "redis"], default="memory",
                    help="cache mode: the in-memory store, or a redis-server the harness starts (default memory)")
    ap.add_argument("--c1-targets", default="direct,hyper-floor,rebound,hyper-floor-unpinned,rebound-unpinned",
                    help="c1 mode: from direct,hyper-floor,nginx,rebound,rebound-1-thread,hyper-floor-unpinned,"
                         "rebound-unpinned (direct is the baseline)")
    ap.add_argument("--spread-targets", default="hyper-floor-unpinned,rebound-unpinned",
                    help="spread mode: from the c1 targets (default hyper-floor-unpinned,rebound-unpinned)")
    ap.add_argument("--spread-connections", default="64,4",
                    help="spread mode: wrk's connections, one phase each (default 64,4)")
    ap.add_argument("--body-targets", default=",".join(BODY_TARGETS),
                    help=f"body mode: from {','.join(BODY_TARGETS)} (direct is the baseline)")
    ap.add_argument("--body-shape", choices=["string", "chat"], default="string",
                    help="body mode: one long string (default), or a conversation of short messages with "
                         "escapes in every one, as agents send")
    ap.add_argument("--fleet-topology", default=",".join(FLEET_TOPOLOGIES),
                    help="fleet mode: from single (one redis-server), cluster (3 masters, no replicas); default both")
    ap.add_argument("--fleet-connections", type=int, default=8,
                    help="fleet and limits modes: wrk connections to each of the 3 replicas (default 8)")
    ap.add_argument("--brownout-phases", default="32:30,8:60,32:30",
                    help="brownout mode: the provider's capacity and how long it lasts, in turn (default "
                         "32:30,8:60,32:30)")
    ap.add_argument("--brownout-statics", default="8,16,32",
                    help="brownout mode: the fixed concurrency limits compared (default 8,16,32)")
    ap.add_argument("--brownout-rate", type=float, default=0.0,
                    help="brownout mode: requests per second offered (default: twice the first capacity's "
                         "throughput)")
    ap.add_argument("--mode", default="forward", choices=MODES,
                    help="forward: direct vs nginx vs rebound (default); idempotency: rebound's CPU per keyed "
                         "request with its in-memory idempotency store empty, then full; follow: one SSE stream "
                         "and its followers (--sse-streams per round sharing a key) against as many independent "
                         "streams; policy: CPU per request with retry, breaker and idempotency policies vs plain "
                         "forwarding; scale: memory and CPU with --idle-connections idle connections, then "
                         "--scale-streams concurrent SSE streams (rebound, and nginx unless --targets rebound); "
                         "fleet: Redis CPU per keyed request with 3 replicas on one Redis and on a 3-master Cluster; "
                         "limits: CPU per request with a fleet-wide limit vs plain forwarding, then the limit's "
                         "Redis calls and Redis CPU per admitted request with 3 replicas on one Redis; "
                         "brownout: a provider whose capacity drops and comes back, 3 replicas with no limit, "
                         "fixed limits and an adaptive one")
    ap.add_argument("--runs", type=int, default=None,
                    help="repeat everything N times, report the median (default 1; 3 in the fleet and limits modes)")
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help="comma-separated, from direct,nginx,rebound,hyper-floor (default: the first three)")
    ap.add_argument("--duration", type=int, default=10, help="throughput phase seconds (default 10)")
    ap.add_argument("--connections", type=int, default=64, help="throughput concurrency (default 64)")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured warm-up seconds before the throughput phase")
    ap.add_argument("--rate", type=int, default=1000, help="fixed request rate of the latency phase (default 1000)")
    ap.add_argument("--latency-duration", type=int, default=20, help="latency phase seconds (default 20)")
    ap.add_argument("--latency-connections", type=int, default=32, help="oha connections in the latency phase")
    ap.add_argument("--sse-streams", type=int, default=200, help="concurrent SSE streams (default 200)")
    ap.add_argument("--sse-events", type=int, default=20, help="events per stream before [DONE] (default 20)")
    ap.add_argument("--sse-gap-ms", type=int, default=10, help="ms between events (default 10)")
    ap.add_argument("--sse-rounds", type=int, default=5, help="rounds of concurrent streams (default 5)")
    ap.add_argument("--quiet-wait", type=int, default=120,
                    help="before each target, wait up to this many seconds for other processes to use less "
                         "than 10%% of a core (0: do not wait; default 120)")
    ap.add_argument("--quick", action="store_true", help="short phases (3 s / 5 s / 1 SSE round): checks the harness, not a result")
    ap.add_argument("--results", default=str(BENCH / "results.jsonl"), help="JSON lines file to append to ('' to skip)")
    ap.add_argument("--no-build", action="store_true", help="use the existing release binaries")
    ap.add_argument("--no-install", action="store_true", help="do not install missing tools, just say what is missing")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (configs, logs)")
    ap.add_argument("--idem-requests", type=int, default=9000,
                    help=f"idempotency mode: keyed requests measured per phase (default 9000; below the store's "
                         f"{IDEM_MAX_ENTRIES} records, so that 'empty' never reaches its bound)")
    ap.add_argument("--idem-prefill", type=int, default=12000,
                    help="idempotency mode: keyed requests sent (not measured) before the 'full' phase (default 12000)")
    ap.add_argument("--idem-reps", type=int, default=5,
                    help="idempotency mode: phases per state and run, each on a fresh rebound (default 5)")
    ap.add_argument("--idle-connections", type=int, default=10000,
                    help="scale mode: keep-alive client connections held idle at once (default 10000)")
    ap.add_argument("--idle-batch", type=int, default=500,
                    help="scale mode: connections opened (and requests sent) at a time (default 500)")
    ap.add_argument("--idle-seconds", type=int, default=10,
                    help="scale mode: seconds the connections stay idle while the proxy's CPU is measured (default 10)")
    ap.add_argument("--scale-streams", type=int, default=2000,
                    help="scale mode: concurrent SSE streams (default 2000)")
    ap.add_argument("--scale-events", type=int, default=40, help="scale mode: events per stream (default 40)")
    ap.add_argument("--scale-gap-ms", type=int, default=50, help="scale mode: ms between events (default 50)")
    return ap


def split_list(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def mode_targets(ap, args, targets_given):
    """What the mode implies for the targets (and checks its own target list)."""
    if args.mode in ("idempotency", "follow", "policy", "cache", "fleet", "limits", "brownout"):
        args.targets = "rebound"
    if args.mode == "brownout":
        try:
            phases = parse_phases(args.brownout_phases)
            args.brownout_statics = [int(n) for n in split_list(args.brownout_statics)]
        except ValueError:
            ap.error("--brownout-phases: capacity:seconds,...; --brownout-statics: numbers")
        if not phases or any(c < 1 or not 1 <= s <= 600 for c, s in phases):
            ap.error("--brownout-phases: capacity from 1, seconds from 1 to 600")
        if any(n < 1 for n in args.brownout_statics) or not 0 <= args.brownout_rate <= 10000:
            ap.error("--brownout-statics from 1, --brownout-rate 0..10000")
    if args.mode == "fleet":
        topologies = split_list(args.fleet_topology)
        if not topologies or set(topologies) - set(FLEET_TOPOLOGIES):
            ap.error(f"--fleet-topology: from {','.join(FLEET_TOPOLOGIES)}")
        args.fleet_topology = [t for t in FLEET_TOPOLOGIES if t in topologies]
    if args.mode == "body":
        args.body_targets = split_list(args.body_targets)
        if set(args.body_targets) - set(BODY_TARGETS) or "direct" not in args.body_targets:
            ap.error(f"--body-targets: from {','.join(BODY_TARGETS)}, direct included (the baseline)")
        args.targets = ",".join({"rebound-keyed": "rebound"}.get(t, t) for t in args.body_targets)
    if args.mode == "c1":
        args.c1_targets = split_list(args.c1_targets)
        if set(args.c1_targets) - set(C1_TARGETS) or "direct" not in args.c1_targets:
            ap.error(f"--c1-targets: from {','.join(C1_TARGETS)}, direct included (the baseline)")
        args.targets = ",".join({"rebound-1-thread": "rebound", "rebound-unpinned": "rebound",
                                 "hyper-floor-unpinned": "hyper-floor"}.get(t, t) for t in args.c1_targets)
    if args.mode == "spread":
        args.spread_targets = split_list(args.spread_targets)
        if set(args.spread_targets) - set(C1_TARGETS) or "direct" in args.spread_targets:
            ap.error(f"--spread-targets: from {','.join(t for t in C1_TARGETS if t != 'direct')}")
        args.targets = ",".join({"rebound-1-thread": "rebound", "rebound-unpinned": "rebound",
                                 "hyper-floor-unpinned": "hyper-floor"}.get(t, t) for t in args.spread_targets)
    if args.mode == "scale":
        if not targets_given:
            args.targets = "rebound,nginx"
        if set(split_list(args.targets)) - {"rebound", "nginx", "hyper-floor"}:
            ap.error("--mode scale: --targets from rebound,nginx,hyper-floor")


def limits(args):
    """(within bounds, what the bound is) for every knob with one."""
    return [
        (1 <= args.runs <= 50, "--runs 1..50"),
        (1 <= args.duration <= 300, "--duration 1..300"),
        (1 <= args.latency_duration <= 300, "--latency-duration 1..300"),
        (0 <= args.warmup <= 60, "--warmup 0..60"),
        (0.0 <= args.hit_ratio <= 1.0, "--hit-ratio 0..1"),
        (0 <= args.quiet_wait <= 3600, "--quiet-wait 0..3600"),
        (1 <= args.connections <= 1024 and 1 <= args.latency_connections <= 1024, "connections 1..1024"),
        (1 <= args.rate <= 100000, "--rate 1..100000"),
        (1 <= args.sse_streams <= 2000 and 1 <= args.sse_rounds <= 50, "--sse-streams 1..2000, --sse-rounds 1..50"),
        (1 <= args.sse_events <= 1000 and 0 <= args.sse_gap_ms <= 1000, "--sse-events 1..1000, --sse-gap-ms 0..1000"),
        (100 <= args.idem_requests and args.idem_requests + args.connections < IDEM_MAX_ENTRIES,
         f"--idem-requests 100..{IDEM_MAX_ENTRIES - 1} - --connections (the empty store must stay below its bound)"),
        (IDEM_MAX_ENTRIES < args.idem_prefill <= 1_000_000, f"--idem-prefill {IDEM_MAX_ENTRIES + 1}..1000000"),
        (1 <= args.idem_reps <= 50, "--idem-reps 1..50"),
        (1 <= args.idle_connections <= 25000, "--idle-connections 1..25000 (ephemeral ports)"),
        (1 <= args.idle_batch <= 1000, "--idle-batch 1..1000 (below the listen backlog)"),
        (1 <= args.idle_seconds <= 300, "--idle-seconds 1..300"),
        (1 <= args.scale_streams <= 5000, "--scale-streams 1..5000"),
        (1 <= args.scale_events <= 1000 and 0 <= args.scale_gap_ms <= 1000, "--scale-events 1..1000, --scale-gap-ms 0..1000"),
        (1 <= args.fleet_connections <= 256, "--fleet-connections 1..256"),
    ]


def parse_args(argv=None, description=None):
    """The options of `argv` (default: the command line), with what --quick and the mode imply;
    targets as a list in ALL_TARGETS' order. Exits with a usage message when one is wrong."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = build_parser(description)
    targets_given = any(a == "--targets" or a.startswith("--targets=") for a in argv)
    args = ap.parse_args(argv)
    if args.runs is None:
        args.runs = 3 if args.mode in ("fleet", "limits") else 1
    if args.quick:
        args.duration, args.latency_duration, args.warmup, args.sse_rounds = 3, 5, 1, 1
        args.idem_reps = 1
        args.idle_seconds = 3
        args.brownout_phases, args.brownout_statics = "32:4,8:8,32:4", "8,32"
    mode_targets(ap, args, targets_given)
    targets = split_list(args.targets)
    bad = [t for t in targets if t not in ALL_TARGETS]
    if bad or not targets:
        ap.error(f"unknown targets {bad}; choose from {ALL_TARGETS}")
    args.targets = [t for t in ALL_TARGETS if t in targets]
    for ok, what in limits(args):
        if not ok:
            ap.error(f"out of bounds: {what}")
    return args


def run_params(args):
    """The knobs recorded as `params` in every result line of the run."""
    params = {
        k: getattr(args, k)
        for k in ("duration", "connections", "warmup", "quiet_wait", "rate", "latency_duration", "latency_connections",
                  "sse_streams", "sse_events", "sse_gap_ms", "sse_rounds", "quick")
    }
    params.update(proxy_cpu=PROXY_CPU, load_cpu=LOAD_CPU, mode=args.mode)
    if args.mode == "idempotency":
        params.update(idem_requests=args.idem_requests, idem_prefill=args.idem_prefill, idem_reps=args.idem_reps)
    if args.mode == "policy":
        params.update(policy_config=str(REBOUND_POLICY_CONFIG.relative_to(ROOT)), plain_config=str(REBOUND_CONFIG.relative_to(ROOT)))
    if args.mode == "cache":
        params.update(hit_ratio=args.hit_ratio, cache_store=args.cache_store, cache_hot=CACHE_HOT)
    if args.mode == "fleet":
        params.update(fleet_topology=args.fleet_topology, fleet_connections=args.fleet_connections,
                      fleet_replicas=len(FLEET_REPLICAS), fleet_masters=FLEET_MASTERS, fleet_idle_s=FLEET_IDLE_S,
                      fleet_config=str(REBOUND_IDEM_CONFIG.relative_to(ROOT)) + " + [redis]")
    if args.mode == "limits":
        params.update(limits_config=str(REBOUND_LIMITS_CONFIG.relative_to(ROOT)),
                      plain_config=str(REBOUND_CONFIG.relative_to(ROOT)), limits_teams=list(LIMITS_TEAMS),
                      fleet_connections=args.fleet_connections, fleet_replicas=len(FLEET_REPLICAS),
                      fleet_idle_s=FLEET_IDLE_S,
                      fleet_config=str(REBOUND_LIMITS_CONFIG.relative_to(ROOT)) + " + [redis] (one redis-server)")
    if args.mode == "brownout":
        params.update(brownout_phases=args.brownout_phases, brownout_statics=args.brownout_statics,
                      brownout_rate=args.brownout_rate, brownout_config="bench/rebound.brownout.bench.toml")
    if args.mode == "scale":
        params.update(idle_connections=args.idle_connections, idle_batch=args.idle_batch, idle_seconds=args.idle_seconds,
                      scale_streams=args.scale_streams, scale_events=args.scale_events, scale_gap_ms=args.scale_gap_ms)
    return params
