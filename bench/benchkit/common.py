"""What every module shares: paths, ports, cores, the harness's error and its log line."""

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PROXY_CPU = "0"  # the proxy under test
LOAD_CPU = "1"  # load tools and the fake upstream
OHA_VERSION = "1.16.0"  # version the harness was written against (installed if oha is missing)

HOST = "127.0.0.1"
UPSTREAM_PORT = 19000
NGINX_PORT = 18081
REBOUND_PORT = 18080
FLOOR_PORT = 18082
ADMIN_PORT = 19901
URLS = {
    "direct": f"http://{HOST}:{UPSTREAM_PORT}/v1/chat/completions",
    "nginx": f"http://{HOST}:{NGINX_PORT}/fake/v1/chat/completions",
    "rebound": f"http://{HOST}:{REBOUND_PORT}/fake/v1/chat/completions",
    "hyper-floor": f"http://{HOST}:{FLOOR_PORT}/fake/v1/chat/completions",
}
ALL_TARGETS = ["direct", "nginx", "rebound", "hyper-floor"]
DEFAULT_TARGETS = ["direct", "nginx", "rebound"]
# cargo's target dir: CARGO_TARGET_DIR when set (relative to the repository, where cargo runs)
TARGET_DIR = ROOT / os.environ.get("CARGO_TARGET_DIR", "target")
FAKE_PROVIDER = TARGET_DIR / "release/examples/fake-provider"
# REBOUND_BIN in the environment: another rebound binary (one built at an earlier commit, to compare)
REBOUND_BIN = Path(os.environ.get("REBOUND_BIN") or TARGET_DIR / "release/rebound")
HYPER_FLOOR = TARGET_DIR / "release/examples/hyper-floor"
REBOUND_CONFIG = BENCH / "rebound.bench.toml"
REBOUND_IDEM_CONFIG = BENCH / "rebound.idempotency.bench.toml"
REBOUND_POLICY_CONFIG = BENCH / "rebound.policy.bench.toml"
REBOUND_CACHE_CONFIG = BENCH / "rebound.cache.bench.toml"
REBOUND_LIMITS_CONFIG = BENCH / "rebound.limits.bench.toml"
LIMITS_TEAMS = ("alpha", "beta", "gamma")  # the limits mode's x-team values: a bucket each
LIMIT_REDIS_OPS = ("limit_lease", "limit_slots", "limit_adjust")  # rebound's Redis calls for limits
CACHE_REDIS_PORT = 16379
CACHE_HOT = 16  # distinct requests in the hot set (stored before each cached phase)
IDEM_MAX_ENTRIES = 10_000  # the in-memory idempotency store's bound (MemoryLimits::default())
# the fleet mode: three replicas on one Redis (one server, or a Cluster of three masters)
FLEET_REPLICAS = ((REBOUND_PORT, ADMIN_PORT), (18081, 19902), (18083, 19903))  # (port, admin port) each
FLEET_TOPOLOGIES = ("single", "cluster")
FLEET_REDIS_PORT = 16380  # the first port tried for the single redis-server
FLEET_CLUSTER_PORT = 17001  # the first port tried for the Cluster's nodes (bus ports +10000)
FLEET_MASTERS = 3
FLEET_URLS = [f"http://{HOST}:{port}/fake/v1/chat/completions" for port, _ in FLEET_REPLICAS]
FLEET_IDLE_S = 2.0  # the replicas' background Redis work is measured over this long, before the load
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOISE_PCT = 10.0  # warn when other processes used more than this % of a core during a phase


class BenchError(Exception):
    pass


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
