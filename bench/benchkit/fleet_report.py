"""The fleet mode's numbers and table: Redis CPU, round trips and commands per keyed request, per
master, and the keyed throughput they leave room for."""

import statistics

from .common import FLEET_TOPOLOGIES, BenchError
from .redis_server import calls_of, redis_script_calls
from .render import metric_header, print_columns
from .stats import per


def check_fleet(topology, ws, received):
    """A BenchError unless every replica's answered requests reached the upstream once (the ones
    wrk abandoned may have too) and none was lost; returns the lost count (0)."""
    lost = sum(w["connect"] + w["read"] + w["write"] + w["timeout"] + w["non2xx"] for w in ws)
    for i, (w, got) in enumerate(zip(ws, received)):
        # every answered request reached the upstream once; the ones wrk abandoned may have too
        if got is None or not w["answered"] <= got <= w["sent"] or w["attempts_other"]:
            raise BenchError(f"{topology}: replica {i}: upstream calls {got} not within answered {w['answered']} .. "
                             f"sent {w['sent']}, or {w['attempts_other']} responses with x-rebound-attempts != 1")
    if lost:
        raise BenchError(f"{topology}: {lost} keyed requests lost (socket errors or non-2xx): {ws}")
    return lost


def fleet_metrics(topology, ports, ws, received, ph, idle, load):
    """A run's numbers; a BenchError when a request was lost or did not reach the upstream once.
    ws: wrk's summaries (WRK_KEYED_LUA), received: the upstream's count per replica, ph: the load's
    CPU accounting, idle and load: redis_delta over the idle window and over the load."""
    lost = check_fleet(topology, ws, received)
    n = sum(received)  # keyed requests claimed, forwarded and completed
    idle_s, idle_d = idle
    window_s, load_d = load
    cpu = sum(master["cpu_s"] for master in load_d.values())
    idle_cpu = sum(master["cpu_s"] for master in idle_d.values())
    cmds = {}
    for master in load_d.values():
        for c, s in master["cmds"].items():
            cmds[c] = cmds.get(c, 0) + s["calls"]
    total_calls = sum(cmds.values())
    master_cpu = [load_d[p]["cpu_s"] for p in ports]
    master_calls = [calls_of(load_d[p]["cmds"]) for p in ports]
    m = {
        "fleet_topology": topology,
        "fleet_masters": len(ports),
        "fleet_replicas": len(ws),
        "fleet_requests": sum(w["answered"] for w in ws),
        "fleet_sent": sum(w["sent"] for w in ws),
        "fleet_upstream_received": n,
        "fleet_rps": sum(w["answered"] for w in ws) / (max(w["duration_us"] for w in ws) / 1e6),
        "fleet_p50_ms": statistics.median(w["p50_us"] for w in ws) / 1000.0,
        "fleet_p99_ms": max(w["p99_us"] for w in ws) / 1000.0,
        "fleet_proxy_cpu_us_per_keyed_req": per(ph["cpu_s"], n),
        "redis_window_s": window_s,
        "redis_cpu_s": cpu,
        "redis_core_busy_pct": 100.0 * cpu / window_s,
        "redis_busiest_master_busy_pct": 100.0 * max(master_cpu) / window_s,
        "redis_cpu_us_per_keyed_req": per(cpu, n),
        "redis_cpu_us_per_keyed_req_net": per(cpu - idle_cpu / idle_s * window_s, n),
        "redis_bg_cpu_pct": 100.0 * idle_cpu / idle_s,
        "redis_bg_cmds_per_s": sum(calls_of(x["cmds"]) for x in idle_d.values()) / idle_s,
        # wall time inside the scripts (EVALSHA's usec includes the commands they run, which
        # commandstats also counts apart), preemptions by the load core's other processes included
        "redis_script_usec_per_keyed_req": per(sum(s["usec"] for x in load_d.values() for c, s in x["cmds"].items()
                                                   if c in ("evalsha", "eval")), n, 1),
        "redis_calls_per_keyed_req": per(total_calls, n, 1),
        "redis_evalsha_per_keyed_req": per(sum(redis_script_calls(x["cmds"]) for x in load_d.values()), n, 1),
        "redis_calls_by_command_per_keyed_req": {c: k / n for c, k in sorted(cmds.items())},
        "keyed_ceiling_per_redis_core": per(n, cpu, 1),
        "redis_master_ports": ports,
        "redis_master_cpu_us_per_keyed_req": [per(c, n) for c in master_cpu],
        "redis_master_cpu_share_pct": [100.0 * c / cpu for c in master_cpu],
        "redis_master_calls_share_pct": [100.0 * c / total_calls for c in master_calls],
        "redis_busiest_master_cpu_share_pct": 100.0 * max(master_cpu) / cpu,
        "redis_least_busy_master_cpu_share_pct": 100.0 * min(master_cpu) / cpu,
        # the busiest master saturates first: it bounds the topology
        "keyed_ceiling_topology": per(n, max(master_cpu), 1),
        "lost": lost,
        "other_cpu_pct": ph["other_cpu_pct"],
        "steal_pct": ph["steal_pct"],
    }
    return m


FLEET_ROWS = [
    ("keyed requests answered, 3 replicas", "fleet_requests", "{:.0f}", 1),
    ("throughput (req/s, all on this machine)", "fleet_rps", "{:.0f}", 1),
    ("Redis CPU per keyed request (us)", "redis_cpu_us_per_keyed_req", "{:.1f}", 1),
    ("  same, idle background taken out (us)", "redis_cpu_us_per_keyed_req_net", "{:.1f}", 1),
    ("Redis round trips per keyed request (EVALSHA)", "redis_evalsha_per_keyed_req", "{:.2f}", 1),
    ("Redis commands per keyed request, scripts' own too", "redis_calls_per_keyed_req", "{:.2f}", 1),
    ("Redis busy under the load, all masters (% of a core)", "redis_core_busy_pct", "{:.0f}", 1),
    ("  the busiest master (% of a core)", "redis_busiest_master_busy_pct", "{:.0f}", 1),
    ("Redis idle background, 3 replicas (% of a core)", "redis_bg_cpu_pct", "{:.2f}", 1),
    ("  commands per second", "redis_bg_cmds_per_s", "{:.0f}", 1),
    ("busiest master's share of Redis CPU (%)", "redis_busiest_master_cpu_share_pct", "{:.1f}", 1),
    ("least busy master's share of Redis CPU (%)", "redis_least_busy_master_cpu_share_pct", "{:.1f}", 1),
    ("keyed ceiling of one Redis core (req/s, derived)", "keyed_ceiling_per_redis_core", "{:.0f}", 1),
    ("keyed ceiling of the topology (req/s, derived)", "keyed_ceiling_topology", "{:.0f}", 1),
    ("rebound CPU per keyed request, 3 replicas (us)", "fleet_proxy_cpu_us_per_keyed_req", "{:.1f}", 1),
    ("wrk latency p50, median of the 3 (ms)", "fleet_p50_ms", "{:.3f}", 1),
    ("wrk latency p99, worst of the 3 (ms)", "fleet_p99_ms", "{:.3f}", 1),
    ("lost: errors+non-2xx", "lost", "{:.0f}", 1),
    ("other processes' CPU (%)", "other_cpu_pct", "{:.0f}", 1),
]
FLEET_RATIO_KEYS = ("redis_cpu_us_per_keyed_req", "redis_cpu_us_per_keyed_req_net",
                    "keyed_ceiling_per_redis_core", "keyed_ceiling_topology", "fleet_rps")


def master_shares(per_topo, topologies):
    """For each Cluster topology, a line with each master's median share of Redis CPU and commands."""
    out = []
    for topo in topologies:
        runs_of = per_topo[topo]
        if runs_of and runs_of[0]["fleet_masters"] > 1:
            shares = [
                f"{port}: {statistics.median(m['redis_master_cpu_share_pct'][i] for m in runs_of):.1f}% / "
                f"{statistics.median(m['redis_master_calls_share_pct'][i] for m in runs_of):.1f}%"
                for i, port in enumerate(runs_of[0]["redis_master_ports"])
            ]
            out.append(f"{topo} masters, share of Redis CPU / of its commands: {'; '.join(shares)}")
    return out


def print_fleet_table(agg, per_topo, topologies, runs):
    header = [metric_header(runs)] + list(topologies)
    ratio = None
    if set(FLEET_TOPOLOGIES) <= set(topologies):
        header.append("cluster/single")
        ratio = ("cluster/single", "cluster", "single", FLEET_RATIO_KEYS)
    print_columns(header, FLEET_ROWS, agg, topologies, ratio)
    for line in master_shares(per_topo, topologies):
        print(line, flush=True)


FLEET_NOTE = (
    "\nRedis CPU: used_cpu_sys + used_cpu_user of every master (INFO cpu) over the load, divided by the keyed "
    "requests the upstream received;\nits idle background (heartbeats, fleet sync, Cluster bus) is included "
    "unless said. Ceilings are derived, not measured: one Redis core\nat 100% doing nothing else serves "
    "1e6 / (its CPU us per keyed request) keyed requests a second; a topology is bounded by its busiest\n"
    "master: 1e6 / (that master's CPU us per keyed request of the whole fleet). A busier Redis spends less "
    "per request\n(more commands per event-loop wake-up): ceilings derived from a partly busy Redis are lower "
    "bounds."
)
