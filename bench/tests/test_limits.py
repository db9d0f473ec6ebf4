"""The limits mode: reading /metrics, its wrk script, its numbers, checks and tables."""

import re

import pytest

from benchkit import limits_report as lr
from benchkit.common import LIMITS_TEAMS, REBOUND_LIMITS_CONFIG
from benchkit.fleet import fleet_config_text
from benchkit.loadgen import parse_wrk
from benchkit.lua import WRK_LIMITS_LUA, limits_lua
from benchkit.prom import parse_prom, prom_by, prom_delta, prom_sum
from samples import phase

# rebound's /metrics (shortened): a limited route after some load, with [redis]
METRICS = """\
# HELP rebound_limit_decisions_total Admission decisions by limit and result (admitted, queued, rejected).
# TYPE rebound_limit_decisions_total counter
rebound_limit_decisions_total{limit="team",result="admitted"} 300001
rebound_limit_decisions_total{limit="team",result="queued"} 0
# HELP rebound_limit_tokens_total Tokens by limit and kind: reserved on admission, settled from the reported usage.
# TYPE rebound_limit_tokens_total counter
rebound_limit_tokens_total{kind="reserved",limit="team"} 79800266
rebound_limit_tokens_total{kind="settled",limit="team"} 32400108
# HELP rebound_redis_command_duration_seconds Redis command latency by operation.
# TYPE rebound_redis_command_duration_seconds histogram
rebound_redis_command_duration_seconds_bucket{op="limit_lease",le="0.001"} 7
rebound_redis_command_duration_seconds_bucket{op="limit_lease",le="+Inf"} 8
rebound_redis_command_duration_seconds_sum{op="limit_lease"} 0.004
rebound_redis_command_duration_seconds_count{op="limit_lease"} 8
rebound_redis_command_duration_seconds_sum{op="limit_slots"} 0.002
rebound_redis_command_duration_seconds_count{op="limit_slots"} 4
rebound_redis_command_duration_seconds_sum{op="ping"} 0.001
rebound_redis_command_duration_seconds_count{op="ping"} 10
rebound_requests_total{route="fake",note="a \\"quoted\\" value"} 5 1700000000000
process_open_fds 42
"""


def test_parse_prom_and_its_sums():
    s = parse_prom(METRICS)
    assert s[("rebound_limit_decisions_total", (("limit", "team"), ("result", "admitted")))] == 300001.0
    assert s[("process_open_fds", ())] == 42.0
    assert s[("rebound_requests_total", (("note", 'a "quoted" value'), ("route", "fake")))] == 5.0
    assert ("rebound_redis_command_duration_seconds_bucket", (("le", "+Inf"), ("op", "limit_lease"))) in s
    assert prom_sum(s, "rebound_limit_decisions_total", limit="team") == 300001.0
    assert prom_sum(s, "rebound_limit_decisions_total", result="rejected") == 0.0
    assert prom_by(s, "rebound_redis_command_duration_seconds_count", "op") == {
        "limit_lease": 8.0, "limit_slots": 4.0, "ping": 10.0}
    assert parse_prom("# only comments\n\nnot a sample line at all\nx{a=\"b\"} NaNx\n") == {}


def test_prom_delta_counts_new_series_from_zero():
    a = parse_prom('x{op="a"} 5\ny 1\n')
    b = parse_prom('x{op="a"} 8\nx{op="b"} 2\ny 1\n')
    assert prom_delta(a, b) == {("x", (("op", "a"),)): 3.0, ("x", (("op", "b"),)): 2.0, ("y", ()): 0.0}


def test_limit_counts():
    c = lr.limit_counts(parse_prom(METRICS))
    assert (c["admitted"], c["queued"], c["rejected"]) == (300001.0, 0.0, 0.0)
    assert (c["tokens_reserved"], c["tokens_settled"]) == (79800266.0, 32400108.0)
    assert c["redis_calls"] == {"limit_lease": 8.0, "limit_slots": 4.0, "ping": 10.0}
    assert c["redis_seconds"]["limit_lease"] == 0.004
    assert lr.limit_counts({})["redis_calls"] == {} and lr.limit_counts({})["admitted"] == 0.0


def test_the_script_cycles_the_teams():
    s = limits_lua(LIMITS_TEAMS).format(key="r0-limits-limits")
    assert 'local teams = {"alpha", "beta", "gamma"}' in s
    assert 'wrk.headers["x-team"] = teams[sent % #teams + 1]' in s
    assert """wrk.body = '{"model":"gpt-fake","max_tokens":256}'""" in s
    assert 'wrk.headers["x-fake-key"] = "r0-limits-limits"' in s
    assert 'if headers["ratelimit"] ~= nil then ratelimit = ratelimit + 1 end' in s
    assert '"s429":%d,"ratelimit":%d}\\n\',' in s
    assert not re.findall(r"\{(key|teams)\}", s)
    assert "{teams}" in WRK_LIMITS_LUA  # filled by limits_lua only
    # the body the bench config's comment counts on: 37 bytes, 256 + 10 = 266 tokens reserved
    assert len('{"model":"gpt-fake","max_tokens":256}') == 37


def wrk(answered, sent, **over):
    line = {"requests": answered, "duration_us": 10_000_000, "bytes": 0, "connect": 0, "read": 0, "write": 0,
            "status": 0, "timeout": 0, "p50_us": 1000, "p99_us": 3000, "sent": sent, "answered": answered,
            "non2xx": 0, "s429": 0, "ratelimit": answered}
    line.update(over)
    return parse_wrk("WRKJSON " + __import__("json").dumps(line))


def counts(admitted, redis_calls=None, queued=0, rejected=0, reserved=0, settled=0, seconds=None):
    return {"admitted": admitted, "queued": queued, "rejected": rejected, "tokens_reserved": reserved,
            "tokens_settled": settled, "redis_calls": redis_calls or {}, "redis_seconds": seconds or {}}


def cpu_results(plain_cpu=5.0, limits_cpu=5.6, **limits_over):
    plain = lr.limits_cpu_metrics("plain", wrk(300000, 300064, ratelimit=0), phase(cpu_s=plain_cpu), 300010, counts(0))
    li = lr.limits_cpu_metrics("limits", wrk(300000, 300064, **limits_over), phase(cpu_s=limits_cpu), 300010,
                               counts(300010, reserved=300010 * 266, settled=300010 * 108))
    return {"plain": plain, "limits": li}


def test_cpu_metrics_and_what_the_limit_adds():
    r = cpu_results()
    p, li = r["plain"], r["limits"]
    assert p["limits_cpu_us_per_req"] == pytest.approx(5.0 / 300000 * 1e6)
    assert li["limits_cpu_us_per_req"] == pytest.approx(5.6 / 300000 * 1e6)
    assert li["limits_rps"] == 30000.0 and li["limits_p50_ms"] == 1.0
    assert (li["limits_tokens_reserved_per_req"], li["limits_tokens_settled_per_req"]) == (266.0, 108.0)
    assert li["limits_one_call_per_request"] == 1 and li["limits_lost"] == 0 and li["limits_redis_calls_per_req"] == 0
    assert lr.limits_cpu_problems(r) == []
    added = lr.limits_added(p, li)
    assert added["limits_cpu_us_added"] == pytest.approx(2.0)
    assert added["limits_sched_cpu_us_added"] == pytest.approx(0.0)  # the sample phase's sched_s is the same
    assert added["limits_cpu_us_per_req_over_plain"] == pytest.approx(1.12)
    assert lr.limits_added(dict(p, limits_cpu_us_per_req=None), li)["limits_cpu_us_added"] is None


def test_cpu_problems_fail_the_run():
    r = cpu_results(non2xx=3, s429=3, ratelimit=299997)
    r["limits"].update(limits_queued=2, limits_redis_calls=4)
    r["plain"].update(limits_ratelimit_fields=1)
    assert lr.limits_cpu_problems(r) == [
        "limits: 0 socket errors, 3 responses not 2xx (3 of them 429)",
        "limits: 4 Redis calls counted in /metrics, with no [redis]",
        "plain: 1 responses with a RateLimit field, 0 admissions: the plain route has no limit",
        "limits: 299997 of 300000 responses with a RateLimit field (every admitted request's response has one)",
        "limits: 0 requests refused, 2 queued: the quotas of the bench config must hold nothing back",
    ]
    r = cpu_results()
    r["limits"].update(limits_admitted=299999, limits_upstream_received=None, limits_one_call_per_request=0)
    assert lr.limits_cpu_problems(r) == [
        "limits: upstream calls None not within answered 300000 .. sent 300064",
        "limits: 299999 admissions counted, not within answered 300000 .. sent 300064",
    ]


def fleet_inputs():
    ws = [wrk(40000, 40008, p50_us=800, p99_us=2000), wrk(40000, 40008, p50_us=900, p99_us=4000),
          wrk(40000, 40008, p50_us=1000, p99_us=3000)]
    received = [40000, 40004, 40008]
    load = (10.0, {16380: {"cpu_s": 0.05, "cmds": {"evalsha": {"calls": 12, "usec": 240}, "time": {"calls": 12, "usec": 6},
                                                   "ping": {"calls": 30, "usec": 30}}}})
    idle = (2.0, {16380: {"cpu_s": 0.004, "cmds": {"ping": {"calls": 6, "usec": 6}}}})
    counts_load = [counts(40002, {"limit_lease": 6, "ping": 10}), counts(40004, {"limit_lease": 6, "limit_slots": 0}),
                   counts(40002, {"limit_slots": 0, "ping": 10})]
    counts_life = [counts(60000, {"limit_lease": 12, "limit_slots": 4, "ping": 20}, seconds={"limit_lease": 0.012}),
                   counts(60002, {"limit_lease": 12, "limit_slots": 4}, seconds={"limit_lease": 0.006}),
                   counts(59998, {"limit_lease": 6, "limit_slots": 4}, seconds={"limit_lease": 0.012})]
    return ws, received, load, idle, counts_load, counts_life


def test_fleet_metrics():
    ws, received, load, idle, counts_load, counts_life = fleet_inputs()
    m = lr.limits_fleet_metrics(ws, received, phase(cpu_s=3.6), idle, load, counts_load, counts_life)
    assert (m["limits_fleet_replicas"], m["limits_fleet_requests"], m["limits_fleet_admitted"]) == (3, 120000, 120008)
    assert m["limits_fleet_admitted_life"] == 180000 and m["limits_fleet_upstream_received"] == 120012
    assert m["limits_fleet_rps"] == 12000.0 and m["limits_fleet_p50_ms"] == 0.9 and m["limits_fleet_p99_ms"] == 4.0
    assert m["limits_fleet_limit_lease_calls"] == 12 and m["limits_fleet_limit_slots_calls"] == 0
    assert m["limits_fleet_limit_adjust_calls"] == 0 and m["limits_fleet_limit_adjust_per_admitted"] == 0
    assert m["limits_fleet_limit_lease_per_admitted"] == pytest.approx(12 / 120008)
    assert m["limits_fleet_limit_lease_per_admitted_life"] == pytest.approx(30 / 180000)
    assert m["limits_fleet_limit_slots_per_admitted_life"] == pytest.approx(12 / 180000)
    assert m["limits_fleet_limit_lease_calls_by_replica"] == [6, 6, 0]
    assert m["limits_fleet_limit_lease_calls_by_replica_life"] == [12, 12, 6]
    assert m["limits_fleet_limit_lease_ms_mean_life"] == pytest.approx(1.0)  # 30 ms over 30 calls
    assert m["limits_fleet_limit_adjust_ms_mean_life"] is None
    assert m["limits_fleet_redis_ops"] == {"limit_lease": 12, "limit_slots": 0, "ping": 20}
    assert m["limits_fleet_redis_calls_per_admitted"] == pytest.approx(32 / 120008)
    assert m["limits_fleet_redis_cpu_us_per_admitted"] == pytest.approx(0.05 / 120008 * 1e6)
    assert m["limits_fleet_redis_cpu_us_per_admitted_net"] == pytest.approx((0.05 - 0.004 / 2 * 10) / 120008 * 1e6)
    assert m["limits_fleet_redis_core_busy_pct"] == pytest.approx(0.5)
    assert m["limits_fleet_redis_bg_cpu_pct"] == pytest.approx(0.2) and m["limits_fleet_redis_bg_cmds_per_s"] == 3.0
    assert m["limits_fleet_redis_evalsha_per_admitted"] == pytest.approx(12 / 120008)
    assert m["limits_fleet_redis_commands_per_admitted"] == pytest.approx(54 / 120008)
    assert m["limits_fleet_redis_usec_per_script"] == 20.0
    assert m["limits_fleet_proxy_cpu_us_per_admitted"] == pytest.approx(3.6 / 120008 * 1e6)
    assert m["limits_fleet_lost"] == 0 and m["limits_fleet_429"] == 0
    lines = lr.replica_calls_lines([m])
    assert lines == ["run 1, limit_lease/limit_slots/limit_adjust calls over the load (over the life): "
                     "replica 0: 6/0/0 (12/4/0); replica 1: 6/0/0 (12/4/0); replica 2: 0/0/0 (6/4/0)"]
    assert lr.limits_fleet_problems(ws, received, counts_load) == []


def test_fleet_problems():
    ws, received, _, _, counts_load, _ = fleet_inputs()
    ws[0] = wrk(40000, 40008, non2xx=2, s429=2, ratelimit=39998)
    received[1] = 39999
    counts_load[2] = counts(40009, rejected=1)
    assert lr.limits_fleet_problems(ws, received, counts_load) == [
        "replica 0: 0 socket errors, 2 responses not 2xx (2 of them 429)",
        "replica 0: 39998 of 40000 responses with a RateLimit field",
        "replica 1: upstream calls 39999 not within answered 40000 .. sent 40008",
        "replica 2: 1 requests refused, 0 queued",
        "replica 2: 40009 admissions, not within answered 40000 .. sent 40008",
    ]


def test_tables_and_the_verdict():
    r = cpu_results()
    r["limits"].update(lr.limits_added(r["plain"], r["limits"]))
    text = lr.limits_cpu_table(r, 1)
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "plain", "limits", "limits-plain", "limits/plain"]
    cpu = next(line for line in lines if line.startswith("proxy CPU per request (us)"))
    assert cpu.split()[-4:] == ["16.67", "18.67", "+2.00", "1.120"]
    assert next(line for line in lines if line.startswith("429s")).split()[-4:] == ["0", "0", "-", "-"]
    verdict = lr.added_verdict([r["limits"], dict(r["limits"], limits_cpu_us_added=1.0, limits_sched_cpu_us_added=0.5)])
    assert verdict == ("CPU added per request by the limit (limits - plain, same run): median +1.50 us (per run "
                       "+2.00, +1.00); scheduler runtime +0.25 us; target at most 2 us: met")
    assert lr.added_verdict([dict(r["limits"], limits_cpu_us_added=2.5)]).endswith("target at most 2 us: NOT met")
    assert lr.added_verdict([{}]) == "CPU added per request by the limit: not measured"
    ws, received, load, idle, counts_load, counts_life = fleet_inputs()
    m = lr.limits_fleet_metrics(ws, received, phase(cpu_s=3.6), idle, load, counts_load, counts_life)
    fleet = lr.limits_fleet_table(m, 3).splitlines()
    assert fleet[0].split()[:4] == ["metric", "(median", "of", "3)"]
    assert next(line for line in fleet if line.startswith("limit_lease calls per admitted")).split()[-1] == "0.000100"
    assert "over the replicas' life, warm-up included:" in [line.strip() for line in fleet]


def test_replica_config_text():
    text = fleet_config_text(REBOUND_LIMITS_CONFIG.read_text(), 1, 'url = "redis://127.0.0.1:16380/0"',
                             source=REBOUND_LIMITS_CONFIG, mode="limits", what="the limit's counts on the fleet's Redis")
    assert text.startswith("# Generated by bench/run --mode limits from rebound.limits.bench.toml: replica 2 of 3, "
                           "the limit's counts on the fleet's Redis\n")
    assert 'listen = "127.0.0.1:18081"' in text and 'listen = "127.0.0.1:19902"' in text
    assert 'limits = ["team"]' in text and "[limits.team]" in text and 'key = "header:x-team"' in text
    assert text.endswith('\n[redis]\nurl = "redis://127.0.0.1:16380/0"\n')
