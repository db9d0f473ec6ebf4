"""CPU accounting around a load phase, and waiting for a quiet machine before one."""

import os
import time

from .common import LOAD_CPU, NOISE_PCT, PROXY_CPU, log
from .procstat import cpu_stat, proc_cpu_s


def wait_quiet(max_wait, threshold=None):
    """Wait (at most max_wait seconds) until the machine has been quiet for 2 s: less than
    NOISE_PCT% of a core busy, measured from /proc/stat while nothing of the benchmark runs
    but an idle upstream. Returns (seconds waited, last busy %)."""
    threshold = NOISE_PCT if threshold is None else threshold
    t0 = time.monotonic()
    busy_pct = None
    while True:
        a, ta = cpu_stat()["cpu"][0], time.monotonic()
        time.sleep(2.0)
        b, tb = cpu_stat()["cpu"][0], time.monotonic()
        busy_pct = 100.0 * (b - a) / (tb - ta)
        waited = time.monotonic() - t0
        if busy_pct < threshold or waited >= max_wait:
            return waited, busy_pct


def settle(args):
    """Before a measured phase: wait (bounded) for the machine to be quiet, if asked."""
    if args.quiet_wait <= 0:
        return
    waited, busy = wait_quiet(args.quiet_wait)
    if busy >= NOISE_PCT:
        log(f"    machine still busy ({busy:.0f}% of a core) after waiting {waited:.0f} s; going on")
    elif waited > 3:
        log(f"    waited {waited:.0f} s for the machine to be quiet")


def phase_delta(a, b):
    """Between two Phase snapshots: wall seconds, the proxy's CPU seconds (utime+stime and
    scheduler runtime; None for direct), each core's busy %, other processes' CPU as a % of a core
    (never below 0) and the hypervisor's steal %."""
    wall = b["t"] - a["t"]
    d = {"wall_s": wall, "cpu_s": None, "sched_s": None}
    proxy = 0.0
    if a["proxy"] is not None:
        d["cpu_s"] = b["proxy"][0] - a["proxy"][0]
        d["sched_s"] = b["proxy"][1] - a["proxy"][1]
        proxy = d["cpu_s"]
    if a.get("switches") is not None and b.get("switches") is not None:
        d["vol_switches"] = b["switches"][0] - a["switches"][0]
        d["invol_switches"] = b["switches"][1] - a["switches"][1]
    busy = {k: b["stat"][k][0] - a["stat"][k][0] for k in b["stat"] if k in a["stat"]}
    steal = b["stat"]["cpu"][1] - a["stat"]["cpu"][1]
    ours = proxy + (b["upstream"] - a["upstream"]) + (b["tools"] - a["tools"])
    d["core0_busy_pct"] = 100.0 * busy.get("cpu" + PROXY_CPU, 0) / wall
    d["core1_busy_pct"] = 100.0 * busy.get("cpu" + LOAD_CPU, 0) / wall
    d["other_cpu_pct"] = max(0.0, 100.0 * (busy["cpu"] - ours) / wall)
    d["steal_pct"] = 100.0 * steal / wall
    return d


class Phase:
    """CPU accounting around one load phase: the proxy's CPU (utime+stime and scheduler runtime),
    each core's busy time, and the CPU used by processes that are not part of the benchmark
    (machine busy time minus proxy, upstream and the load tool), which flags a noisy machine."""

    def __init__(self, target, upstream_pid, running_tools=None, include_self=False):
        self.target, self.upstream_pid = target, upstream_pid
        # the harness itself is a load tool in the phase (the scale mode's idle connections)
        self.include_self = include_self
        # load tools started in the phase and still running at its end (not yet in os.times())
        self.running_tools = running_tools if running_tools is not None else []
        self.snap0 = self.snap()

    def snap(self):
        children = os.times()
        return {
            "t": time.monotonic(),
            "proxy": self.target.cpu_s(),
            "switches": self.target.switches(),
            "upstream": proc_cpu_s(self.upstream_pid),
            "tools": children.children_user + children.children_system
            + sum(proc_cpu_s(p) for p in self.running_tools if os.path.exists(f"/proc/{p}"))
            + ((children.user + children.system) if self.include_self else 0.0),
            "stat": cpu_stat(),
        }

    def end(self):
        return phase_delta(self.snap0, self.snap())
