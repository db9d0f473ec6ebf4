"""The results file: one JSON line per target (or phase) and run, with what identifies the run:
commit, machine, tool versions and every knob."""

import datetime
import hashlib
import json
import os
import platform
import subprocess
import uuid
from pathlib import Path

from .common import REBOUND_BIN, ROOT
from .tools import find_tool, tool_version


def append_result(path, line):
    """One JSON line (floats rounded by tidy) appended to the results file."""
    with open(path, "a") as f:
        f.write(json.dumps(tidy(line), sort_keys=True) + "\n")


def tidy(v):
    """Round floats to 6 significant digits for the JSON lines."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, dict):
        return {k: tidy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [tidy(x) for x in v]
    return v


def now_ts():
    """The time a run's lines are stamped with: UTC, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def new_run_id():
    """One invocation's id: its UTC start time and 6 random hex digits."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


class RunInfo:
    """What every line of one invocation shares (run id, commit, machine, tools, knobs), and the
    heading its tables are printed under."""

    def __init__(self, run_id, commit, dirty, machine, tools, params):
        self.run_id, self.commit, self.dirty = run_id, commit, dirty
        self.machine, self.tools, self.params = machine, tools, params

    @property
    def commit_label(self):
        return f"{self.commit[:12]}{' (dirty)' if self.dirty else ''}"

    def record(self, **fields):
        """One result line: `fields` (ts, run, runs, target, url, metrics, ...) and the shared ones."""
        return dict(fields, run_id=self.run_id, git_commit=self.commit, git_dirty=self.dirty,
                    machine=self.machine, tools=self.tools, params=self.params)

    def headline(self, setup):
        """The line above a mode's final table: run id, commit, CPU, cores, then `setup`."""
        return (f"\n{self.run_id}  commit {self.commit_label}  {self.machine.get('cpu_model', '?')}, "
                f"{self.machine['nproc']} cores; {setup}")


def git_info():
    def git(*a):
        r = subprocess.run(["git", "-C", str(ROOT)] + list(a), capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None

    return git("rev-parse", "HEAD") or "none", bool(git("status", "--porcelain", "--untracked-files=no"))


def machine_info():
    info = {"nproc": os.cpu_count(), "kernel": platform.release(), "arch": platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_total_kib"] = int(line.split()[1])
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                info["os"] = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return info


def tools_info(targets):
    t = {
        "nginx": tool_version([find_tool("nginx") or "nginx", "-v"]),
        "wrk": tool_version([find_tool("wrk") or "wrk", "-v"]),
        "redis": tool_version([find_tool("redis-server") or "redis-server", "--version"]),
        "oha": tool_version([find_tool("oha") or "oha", "--version"]),
        "python": platform.python_version(),
        "rustc": tool_version(["rustc", "--version"]),
    }
    if "rebound" in targets and REBOUND_BIN.exists():
        t["rebound_sha256"] = hashlib.sha256(REBOUND_BIN.read_bytes()).hexdigest()[:16]
    return t
