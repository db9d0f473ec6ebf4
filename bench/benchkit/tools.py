"""The tools the harness needs: finding them, their versions, installing the missing ones, and
building the release binaries."""

import os
import shutil
import subprocess
from pathlib import Path

from .common import OHA_VERSION, REBOUND_BIN, ROOT, BenchError, log


def find_tool(name):
    p = shutil.which(name)
    if p:
        return p
    for d in ("/usr/sbin", "/sbin", str(Path.home() / ".cargo/bin")):
        c = Path(d) / name
        if c.exists():
            return str(c)
    return None


def tool_version(argv):
    try:
        r = subprocess.run(argv, capture_output=True, timeout=10)
        text = (r.stdout + r.stderr).decode(errors="replace").strip().splitlines()
        return text[0].strip() if text else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def apt_tools(args):
    """(tool, Debian package) pairs the mode needs from apt."""
    needed = (("wrk", "wrk"), ("taskset", "util-linux"))
    if args.mode == "forward" or (args.mode in ("scale", "c1", "body") and "nginx" in args.targets):
        needed = (("nginx", "nginx"),) + needed
    if args.mode in ("fleet", "limits", "brownout") or (args.mode == "cache" and args.cache_store == "redis"):
        needed = (("redis-server", "redis-server"), ("redis-cli", "redis-tools")) + needed
    return needed


def ensure_tools(args):
    missing_apt = [pkg for tool, pkg in apt_tools(args) if not find_tool(tool)]
    if missing_apt:
        if args.no_install or os.geteuid() != 0:
            raise BenchError(
                f"missing tools from apt: {' '.join(missing_apt)}; install with: "
                f"apt-get update && apt-get install -y {' '.join(missing_apt)}"
            )
        log(f"installing with apt-get: {' '.join(missing_apt)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], check=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + missing_apt, check=True, env=env, timeout=900)
    if args.mode != "forward":
        return
    if not find_tool("oha"):
        cmd = ["cargo", "install", "oha", "--version", OHA_VERSION, "--locked"]
        if args.no_install:
            raise BenchError(f"oha is missing; install with: {' '.join(cmd)}")
        log(f"installing oha (a few minutes of compiling): {' '.join(cmd)}")
        subprocess.run(cmd, check=True, timeout=3600)
    ver = tool_version([find_tool("oha"), "--version"]) or ""
    if OHA_VERSION not in ver:
        log(f"warning: harness written against oha {OHA_VERSION}, found '{ver}'")


def build_command(targets):
    """The cargo command that builds the release binaries `targets` need."""
    cmd = ["cargo", "build", "--release", "--example", "fake-provider"]
    if "rebound" in targets:
        cmd[3:3] = ["--bin", "rebound"]
    if "hyper-floor" in targets:
        cmd += ["--example", "hyper-floor"]
    return cmd


def build(args, targets):
    if args.no_build:
        return
    cmd = build_command(targets)
    log("building: " + " ".join(cmd))
    r = subprocess.run(cmd, cwd=ROOT, timeout=3600)
    if r.returncode != 0:
        hint = " (the nginx and direct targets alone: --targets direct,nginx)" if "rebound" in targets else ""
        raise BenchError(f"build failed: {' '.join(cmd)}{hint}")


def rebound_check(path):
    """`rebound check --config PATH`; a BenchError with its output when it rejects the file."""
    r = subprocess.run([str(REBOUND_BIN), "check", "--config", str(path)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise BenchError(f"rebound check rejected {path}:\n{r.stdout}\n{r.stderr}")
    return r.stdout
