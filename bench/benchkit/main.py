"""bench/run's main: check the machine, tools and ports, then run the chosen mode and stop every
process started, whatever happens."""

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from .body import body_main
from .c1 import c1_main
from .cache import cache_main
from .cli import parse_args, run_params
from .common import (
    ADMIN_PORT, FAKE_PROVIDER, FLEET_REPLICAS, FLOOR_PORT, NGINX_PORT, REBOUND_BIN, REBOUND_PORT, UPSTREAM_PORT,
    BenchError, log,
)
from .fleet import fleet_main
from .brownout import PROVIDER_PORT as BROWNOUT_PORT, brownout_main
from .follow import follow_main
from .forward import forward_main
from .idempotency import idem_main
from .limits import limits_main
from .net import port_free
from .policy import policy_main
from .procs import Procs
from .results import RunInfo, git_info, machine_info, new_run_id, tools_info
from .scale import scale_main
from .spread import spread_main
from .tools import build, ensure_tools

MODES = {"forward": forward_main, "idempotency": idem_main, "follow": follow_main, "policy": policy_main,
         "scale": scale_main, "cache": cache_main, "c1": c1_main, "spread": spread_main, "body": body_main, "fleet": fleet_main,
         "limits": limits_main, "brownout": brownout_main}


def ports_needed(args):
    """{port: what listens on it} for every fixed port of the run."""
    ports = {UPSTREAM_PORT: "fake upstream", NGINX_PORT: "nginx", REBOUND_PORT: "rebound", ADMIN_PORT: "rebound admin",
             FLOOR_PORT: "hyper-floor"}
    if args.mode == "brownout":
        ports[BROWNOUT_PORT] = "brownout provider"
    if args.mode in ("fleet", "limits", "brownout"):
        for i, (port, admin) in enumerate(FLEET_REPLICAS):
            ports.update({port: f"rebound replica {i}", admin: f"rebound replica {i} admin"})
    return ports


def preflight(args):
    """Cores, tools, binaries and free ports, or a BenchError saying what is missing."""
    if (os.cpu_count() or 1) < 2:
        raise BenchError("needs at least 2 cores (proxy on core 0, load and upstream on core 1)")
    ensure_tools(args)
    build(args, args.targets)
    for path in [FAKE_PROVIDER] + ([REBOUND_BIN] if "rebound" in args.targets else []):
        if not path.exists():
            raise BenchError(f"missing {path} (build with cargo build --release)")
    busy = [f"{p} ({n})" for p, n in ports_needed(args).items() if not port_free(p)]
    if busy:
        raise BenchError(f"ports in use: {', '.join(busy)} (a previous run still going, or another server?)")


def main(description=None):
    args = parse_args(description=description)
    preflight(args)
    commit, dirty = git_info()
    info = RunInfo(new_run_id(), commit, dirty, machine_info(), tools_info(args.targets), run_params(args))
    log(f"run {info.run_id}: targets {','.join(args.targets)}, {args.runs} run(s), commit {info.commit_label}")

    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="rebound-bench-"))
    os.chmod(tmp, 0o755)
    ok = False
    try:
        MODES[args.mode](args, procs, tmp, info)
        ok = True
    finally:
        # a second Ctrl-C must not interrupt the cleanup
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        procs.stop_all()
        if ok and not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"logs and configs kept in {tmp}")


def on_sigterm(signum, frame):
    log(f"got signal {signum}; stopping every process started")
    raise SystemExit(128 + signum)


def entry(description=None):
    """bench/run's entry point: `description` is its usage text (for --help)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGHUP, on_sigterm)
    try:
        main(description)
    except BenchError as e:
        log(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("interrupted; stopped every process started")
        sys.exit(130)
