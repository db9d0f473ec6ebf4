"""Starting and stopping processes: each in its own process group, every one stopped at the end."""

import functools
import http.client
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

from .common import FAKE_PROVIDER, HOST, LOAD_CPU, ROOT, UPSTREAM_PORT, URLS, BenchError
from .net import chat_ok
from .procstat import group_members, pgrp_of


def set_nofile(n):
    """In a child before exec: its RLIMIT_NOFILE, soft and hard."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


class Procs:
    """Every process the harness starts, each in its own session (process group), so that it
    can be stopped as a group (nginx's master and worker) and Ctrl-C does not hit it directly."""

    def __init__(self):
        self.live = []

    def spawn(self, name, argv, cpu, logfile=None, capture=False, nofile=None):
        """nofile: RLIMIT_NOFILE (soft and hard) of the child; None inherits the harness's."""
        full = ["taskset", "-c", cpu] + [str(a) for a in argv]
        preexec = None if nofile is None else functools.partial(set_nofile, int(nofile))
        if capture:
            out, err = subprocess.PIPE, subprocess.PIPE
        elif logfile is not None:
            out = open(logfile, "ab")
            err = subprocess.STDOUT
        else:
            out, err = subprocess.DEVNULL, subprocess.DEVNULL
        try:
            p = subprocess.Popen(
                full, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=ROOT, start_new_session=True,
                preexec_fn=preexec,
            )
        finally:
            if logfile is not None and not capture:
                out.close()
        p.bench_name = name
        p.bench_log = logfile
        self.live.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM, grace=10.0):
        if p.poll() is None:
            group = group_members(p.pid)  # the process and what it forked (nginx's worker)
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
            # members of our group that outlived the leader, by pid, checked to still be ours
            for pid in group:
                if pid != p.pid and pgrp_of(pid) == p.pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if p in self.live:
            self.live.remove(p)

    def stop_all(self):
        for p in reversed(list(self.live)):
            self.stop(p)

    def run_tool(self, name, argv, cpu, timeout):
        """Run a bounded load tool to completion; returns (returncode, stdout, stderr)."""
        p = self.spawn(name, argv, cpu, capture=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(p, signal.SIGKILL)
            raise BenchError(f"{name} did not finish within {timeout:.0f} s")
        finally:
            if p in self.live and p.poll() is not None:
                self.live.remove(p)
        return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def tail(path, n=30):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    except OSError:
        return "(no log)"


def wait_until(desc, check, proc=None, timeout=30.0):
    """Poll check() until it returns True (bounded in time); fail early if proc exits."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BenchError(
                f"{desc}: process exited with status {proc.returncode}\n--- log ---\n{tail(proc.bench_log)}"
            )
        try:
            if check():
                return
        except (OSError, http.client.HTTPException) as e:
            last = e
        time.sleep(0.1)
    extra = f"\n--- log ---\n{tail(proc.bench_log)}" if proc is not None and proc.bench_log else ""
    raise BenchError(f"{desc}: not ready after {timeout:.0f} s (last error: {last}){extra}")


def start_upstream(procs, tmp, run, nofile=None):
    """A fresh fake provider for run `run` (0-based), pinned to the load core, once it answers a
    chat completion; returns (its process, its log file)."""
    up_log = tmp / f"fake-provider-{run}.log"
    upstream = procs.spawn("fake-provider", [FAKE_PROVIDER, "--listen", f"{HOST}:{UPSTREAM_PORT}"], LOAD_CPU,
                           logfile=up_log, nofile=nofile)
    wait_until("fake provider", lambda: chat_ok(URLS["direct"]), upstream)
    return upstream, up_log


def check_upstream(upstream, up_log):
    """A BenchError when the fake provider exited before its run ended."""
    if upstream.poll() is not None:
        raise BenchError(f"fake provider exited\n{tail(up_log)}")
