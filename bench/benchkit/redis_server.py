"""The harness's own redis-server: starting it, and reading its INFO (CPU, commands, scripts)."""

import subprocess
import time

from .common import HOST, LOAD_CPU, BenchError
from .net import port_free
from .procs import wait_until
from .tools import find_tool

HARNESS_REDIS_COMMANDS = ("info", "ping", "cluster|info")  # what the harness itself sends Redis


def redis_cli(port, *argv, timeout=10):
    """stdout of `redis-cli -h 127.0.0.1 -p PORT ARGV...` ('' when it cannot connect)."""
    r = subprocess.run([find_tool("redis-cli") or "redis-cli", "-h", HOST, "-p", str(port)] + [str(a) for a in argv],
                       capture_output=True, text=True, timeout=timeout)
    return r.stdout


def parse_redis_info(out):
    """The text of `INFO` as {field: text}, and under "commandstats" {command: {"calls": n,
    "usec": n}} from its cmdstat_* lines."""
    info = {"commandstats": {}}
    for line in out.splitlines():
        field, sep, value = line.strip().partition(":")
        if not sep:
            continue
        if field.startswith("cmdstat_"):
            stats = dict(kv.split("=", 1) for kv in value.split(","))
            info["commandstats"][field[8:]] = {"calls": int(stats["calls"]), "usec": int(stats["usec"])}
        else:
            info[field] = value
    return info


def redis_info(port, *sections):
    """`INFO SECTIONS...` (default all) of a redis-server as {field: text}, and under "commandstats"
    {command: {"calls": n, "usec": n}} from its cmdstat_* lines."""
    out = redis_cli(port, "info", *(sections or ("all",)), timeout=5)
    info = parse_redis_info(out)
    if len(info) == 1:
        raise BenchError(f"redis-cli info on port {port}: {out[:200]!r}")
    return info


def redis_script_calls(commandstats):
    """EVALSHA and EVAL calls: the round trips of rebound's request path (every one is a script)."""
    return sum(commandstats.get(c, {}).get("calls", 0) for c in ("evalsha", "eval"))


def redis_commands(port):
    """(the commands the harness's redis-server ran, scripts' own included; its script calls, the
    round trips of rebound's request path: every one of them is one EVALSHA)."""
    info = redis_info(port)
    if "total_commands_processed" not in info:
        raise BenchError(f"redis-cli info on port {port}: no total_commands_processed")
    return int(info["total_commands_processed"]), redis_script_calls(info["commandstats"])


def start_redis(procs, d, port, extra=()):
    """A redis-server of the harness's own on `port` (no persistence, files and log in `d`), pinned
    to the load core; returns its process once it answers PING."""
    if not port_free(port):
        raise BenchError(f"port {port} (the harness's redis-server) is in use")
    argv = [find_tool("redis-server"), "--port", port, "--bind", HOST, "--save", "", "--appendonly", "no",
            "--dir", d] + list(extra)
    p = procs.spawn("redis-server", argv, LOAD_CPU, logfile=d / f"redis-{port}.log")
    wait_until(f"redis-server on port {port}", lambda: redis_cli(port, "ping", timeout=2).strip() == "PONG", p)
    return p


def redis_snapshot(ports):
    """(time, {port: its CPU seconds (used_cpu_sys + used_cpu_user), its commandstats})."""
    snap = {}
    for p in ports:
        info = redis_info(p)
        snap[p] = {"cpu_s": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), "cmds": info["commandstats"]}
    return time.monotonic(), snap


def redis_delta(a, b):
    """Between two snapshots: (seconds, {port: {"cpu_s", "cmds": {command: {"calls", "usec"}}}}),
    without the harness's own INFO and PING."""
    out = {}
    for p, after in b[1].items():
        before = a[1][p]["cmds"]
        cmds = {}
        for c, s in after["cmds"].items():
            was = before.get(c, {"calls": 0, "usec": 0})
            if c not in HARNESS_REDIS_COMMANDS and s["calls"] > was["calls"]:
                cmds[c] = {"calls": s["calls"] - was["calls"], "usec": s["usec"] - was["usec"]}
        out[p] = {"cpu_s": after["cpu_s"] - a[1][p]["cpu_s"], "cmds": cmds}
    return b[0] - a[0], out


def calls_of(cmds):
    return sum(s["calls"] for s in cmds.values())
