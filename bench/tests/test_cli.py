"""The command line: defaults, what --quick and each mode imply, bounds, and the recorded knobs."""

import pytest

from benchkit.cli import build_parser, parse_args, run_params
from benchkit.common import BENCH


def error_of(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_defaults():
    a = parse_args([])
    assert a.mode == "forward" and a.targets == ["direct", "nginx", "rebound"] and a.runs == 1
    assert (a.duration, a.connections, a.warmup, a.rate, a.latency_duration, a.latency_connections) == (10, 64, 2, 1000, 20, 32)
    assert (a.sse_streams, a.sse_events, a.sse_gap_ms, a.sse_rounds) == (200, 20, 10, 5)
    assert a.quiet_wait == 120 and a.results == str(BENCH / "results.jsonl")
    assert (a.idem_requests, a.idem_prefill, a.idem_reps) == (9000, 12000, 5)
    assert (a.idle_connections, a.idle_batch, a.idle_seconds) == (10000, 500, 10)
    assert (a.scale_streams, a.scale_events, a.scale_gap_ms, a.fleet_connections) == (2000, 40, 50, 8)
    assert (a.hit_ratio, a.cache_store, a.body_shape) == (0.9, "memory", "string")
    assert not (a.quick or a.no_build or a.no_install or a.keep_tmp)


def test_quick_shortens_the_phases():
    a = parse_args(["--quick", "--duration", "30"])
    assert (a.duration, a.latency_duration, a.warmup, a.sse_rounds, a.idem_reps, a.idle_seconds) == (3, 5, 1, 1, 1, 3)


def test_targets_are_put_in_the_harness_order():
    assert parse_args(["--targets", " hyper-floor,rebound ,direct"]).targets == ["direct", "rebound", "hyper-floor"]


def test_modes_imply_their_targets():
    assert parse_args(["--mode", "policy", "--targets", "direct"]).targets == ["rebound"]
    fleet = parse_args(["--mode", "fleet", "--fleet-topology", "cluster,single"])
    assert fleet.runs == 3 and fleet.targets == ["rebound"] and fleet.fleet_topology == ["single", "cluster"]
    assert parse_args(["--mode", "fleet", "--runs", "1"]).runs == 1
    limits = parse_args(["--mode", "limits", "--targets", "direct"])
    assert limits.runs == 3 and limits.targets == ["rebound"] and limits.fleet_connections == 8
    scale = parse_args(["--mode", "scale"])
    assert scale.targets == ["nginx", "rebound"]
    assert parse_args(["--mode", "scale", "--targets=rebound"]).targets == ["rebound"]
    c1 = parse_args(["--mode", "c1"])
    assert c1.c1_targets == ["direct", "hyper-floor", "rebound", "hyper-floor-unpinned", "rebound-unpinned"]
    assert c1.targets == ["direct", "rebound", "hyper-floor"]
    body = parse_args(["--mode", "body", "--body-targets", "direct,rebound-keyed"])
    assert body.body_targets == ["direct", "rebound-keyed"] and body.targets == ["direct", "rebound"]


@pytest.mark.parametrize("argv, message", [
    (["--targets", "direct,envoy"], "unknown targets ['envoy']; choose from ['direct', 'nginx', 'rebound', 'hyper-floor']"),
    (["--mode", "scale", "--targets", "direct"], "--mode scale: --targets from rebound,nginx,hyper-floor"),
    (["--mode", "c1", "--c1-targets", "rebound"], "direct included (the baseline)"),
    (["--mode", "body", "--body-targets", "direct,envoy"], "--body-targets: from direct,hyper-floor,nginx,rebound,"),
    (["--mode", "fleet", "--fleet-topology", "ring"], "--fleet-topology: from single,cluster"),
    (["--runs", "51"], "out of bounds: --runs 1..50"),
    (["--hit-ratio", "1.5"], "out of bounds: --hit-ratio 0..1"),
    (["--idem-requests", "9937"], "out of bounds: --idem-requests 100..9999 - --connections"),
    (["--idem-prefill", "10000"], "out of bounds: --idem-prefill 10001..1000000"),
    (["--idle-batch", "2000"], "out of bounds: --idle-batch 1..1000 (below the listen backlog)"),
])
def test_errors(argv, message, capsys):
    assert message in error_of(argv, capsys)


def test_help_has_the_description_and_every_mode():
    text = build_parser("bench/run: usage text").format_help()
    assert "bench/run: usage text" in text
    assert "{forward,idempotency,follow,policy,scale,cache,c1,spread,body,fleet,limits,brownout}" in text
    assert "than 10% of a core" in text  # %% in the help string


def test_run_params():
    p = run_params(parse_args(["--mode", "policy", "--quick"]))
    assert p["mode"] == "policy" and p["quick"] is True and p["duration"] == 3
    assert (p["proxy_cpu"], p["load_cpu"]) == ("0", "1")
    assert p["policy_config"] == "bench/rebound.policy.bench.toml" and p["plain_config"] == "bench/rebound.bench.toml"
    assert "idem_requests" not in p
    f = run_params(parse_args(["--mode", "fleet"]))
    assert f["fleet_config"] == "bench/rebound.idempotency.bench.toml + [redis]"
    assert (f["fleet_replicas"], f["fleet_masters"], f["fleet_idle_s"], f["fleet_topology"]) == (3, 3, 2.0, ["single", "cluster"])
    li = run_params(parse_args(["--mode", "limits"]))
    assert li["limits_config"] == "bench/rebound.limits.bench.toml" and li["plain_config"] == "bench/rebound.bench.toml"
    assert li["limits_teams"] == ["alpha", "beta", "gamma"] and (li["fleet_replicas"], li["fleet_connections"]) == (3, 8)
    assert li["fleet_config"] == "bench/rebound.limits.bench.toml + [redis] (one redis-server)"
    c = run_params(parse_args(["--mode", "cache", "--hit-ratio", "0.5"]))
    assert (c["hit_ratio"], c["cache_store"], c["cache_hot"]) == (0.5, "memory", 16)
    s = run_params(parse_args(["--mode", "scale"]))
    assert (s["idle_connections"], s["scale_streams"]) == (10000, 2000)


def test_spread_mode_names_its_targets():
    a = parse_args(["--mode", "spread"])
    assert a.spread_targets == ["hyper-floor-unpinned", "rebound-unpinned"]
    assert a.targets == ["rebound", "hyper-floor"]
