"""Redis INFO, the change between two readings, and the fleet mode's numbers."""

import pytest

from benchkit.common import REBOUND_IDEM_CONFIG, BenchError
from benchkit.fleet import fleet_config_text
from benchkit.fleet_report import check_fleet, fleet_metrics, master_shares
from benchkit.redis_server import calls_of, parse_redis_info, redis_delta, redis_script_calls
from samples import phase

# `redis-cli info all` of redis 7.0 (shortened)
INFO = """\
# Server\r
redis_version:7.0.15\r
redis_mode:standalone\r
tcp_port:16380\r
\r
# CPU\r
used_cpu_sys:1.234567\r
used_cpu_user:2.500000\r
\r
# Stats\r
total_commands_processed:52311\r
\r
# Commandstats\r
cmdstat_evalsha:calls=50000,usec=400000,usec_per_call=8.00,rejected_calls=0,failed_calls=0\r
cmdstat_info:calls=12,usec=900,usec_per_call=75.00,rejected_calls=0,failed_calls=0\r
cmdstat_cluster|info:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r
cmdstat_set:calls=2299,usec=3000,usec_per_call=1.30,rejected_calls=0,failed_calls=0\r
"""


def test_parse_redis_info():
    info = parse_redis_info(INFO)
    assert info["redis_version"] == "7.0.15" and info["total_commands_processed"] == "52311"
    assert float(info["used_cpu_sys"]) + float(info["used_cpu_user"]) == pytest.approx(3.734567)
    assert info["commandstats"] == {"evalsha": {"calls": 50000, "usec": 400000}, "info": {"calls": 12, "usec": 900},
                                    "cluster|info": {"calls": 3, "usec": 30}, "set": {"calls": 2299, "usec": 3000}}
    assert "# Server" not in info and parse_redis_info("Could not connect to Redis") == {"commandstats": {}}
    assert redis_script_calls(info["commandstats"]) == 50000


def snap(t, cpu, evalsha, info_calls, get_calls=0):
    cmds = {"evalsha": {"calls": evalsha, "usec": evalsha * 8}, "info": {"calls": info_calls, "usec": 1}}
    if get_calls:
        cmds["get"] = {"calls": get_calls, "usec": get_calls}
    return {"cpu_s": cpu, "cmds": cmds}


def test_redis_delta_leaves_out_the_harness_commands():
    a = (100.0, {16380: snap(100.0, 1.0, 1000, 5)})
    b = (108.0, {16380: snap(108.0, 3.0, 41000, 7, get_calls=30)})
    seconds, d = redis_delta(a, b)
    assert seconds == 8.0
    assert d[16380]["cpu_s"] == 2.0
    assert d[16380]["cmds"] == {"evalsha": {"calls": 40000, "usec": 320000}, "get": {"calls": 30, "usec": 30}}
    assert calls_of(d[16380]["cmds"]) == 40030


def keyed(answered, sent, **over):
    w = {"requests": answered, "duration_us": 8_000_000, "connect": 0, "read": 0, "write": 0, "status": 0,
         "timeout": 0, "p50_us": 900, "p99_us": 3000, "sent": sent, "answered": answered, "non2xx": 0,
         "attempts_other": 0, "attempts_missing": 0}
    w.update(over)
    return w


def test_check_fleet():
    assert check_fleet("single", [keyed(100, 108), keyed(100, 108)], [100, 108]) == 0
    with pytest.raises(BenchError, match="single: replica 1: upstream calls 99 not within answered 100 .. sent 108"):
        check_fleet("single", [keyed(100, 108), keyed(100, 108)], [100, 99])
    with pytest.raises(BenchError, match="cluster: replica 0: upstream calls None"):
        check_fleet("cluster", [keyed(100, 108)], [None])
    with pytest.raises(BenchError, match="cluster: 2 keyed requests lost"):
        check_fleet("cluster", [keyed(100, 108, timeout=1, non2xx=1)], [100])


def test_fleet_metrics_of_a_cluster():
    ports = [17001, 17002, 17003]
    ws = [keyed(40000, 40008, p50_us=800, p99_us=2000), keyed(40000, 40008, p50_us=900, p99_us=4000),
          keyed(40000, 40008, p50_us=1000, p99_us=3000)]
    received = [40000, 40000, 40000]
    load = (8.0, {17001: {"cpu_s": 2.0, "cmds": {"evalsha": {"calls": 50000, "usec": 500000}}},
                  17002: {"cpu_s": 1.0, "cmds": {"evalsha": {"calls": 40000, "usec": 300000}}},
                  17003: {"cpu_s": 1.0, "cmds": {"evalsha": {"calls": 30000, "usec": 200000},
                                                 "ping": {"calls": 40, "usec": 4}}}})
    idle = (2.0, {p: {"cpu_s": 0.01, "cmds": {"ping": {"calls": 10, "usec": 1}}} for p in ports})
    m = fleet_metrics("cluster", ports, ws, received, phase(cpu_s=3.6), idle, load)
    assert (m["fleet_masters"], m["fleet_replicas"], m["fleet_requests"]) == (3, 3, 120000)
    assert m["fleet_upstream_received"] == 120000
    assert m["fleet_rps"] == 15000.0 and m["fleet_p50_ms"] == 0.9 and m["fleet_p99_ms"] == 4.0
    assert m["redis_cpu_us_per_keyed_req"] == pytest.approx(4.0 / 120000 * 1e6)
    assert m["redis_cpu_us_per_keyed_req_net"] == pytest.approx((4.0 - 0.03 / 2.0 * 8.0) / 120000 * 1e6)
    assert m["redis_core_busy_pct"] == 50.0 and m["redis_busiest_master_busy_pct"] == 25.0
    assert m["redis_bg_cpu_pct"] == pytest.approx(1.5) and m["redis_bg_cmds_per_s"] == 15.0
    assert m["redis_evalsha_per_keyed_req"] == 1.0
    assert m["redis_calls_per_keyed_req"] == pytest.approx(120040 / 120000)
    assert m["redis_script_usec_per_keyed_req"] == pytest.approx(1000000 / 120000)
    assert m["redis_master_cpu_share_pct"] == [50.0, 25.0, 25.0]
    assert m["redis_busiest_master_cpu_share_pct"] == 50.0 and m["redis_least_busy_master_cpu_share_pct"] == 25.0
    assert m["keyed_ceiling_per_redis_core"] == pytest.approx(30000.0)  # 120,000 requests on 4 s of Redis CPU
    assert m["keyed_ceiling_topology"] == pytest.approx(60000.0)  # the busiest master: 2 s for all of them
    assert m["fleet_proxy_cpu_us_per_keyed_req"] == pytest.approx(30.0)
    lines = master_shares({"cluster": [m, m]}, ["cluster"])
    assert lines == ["cluster masters, share of Redis CPU / of its commands: 17001: 50.0% / 41.7%; "
                     "17002: 25.0% / 33.3%; 17003: 25.0% / 25.0%"]
    single = dict(m, fleet_masters=1)
    assert master_shares({"single": [single]}, ["single"]) == []


def test_fleet_config_text():
    text = fleet_config_text(REBOUND_IDEM_CONFIG.read_text(), 2, 'url = "redis://127.0.0.1:16380/0"')
    assert text.startswith("# Generated by bench/run --mode fleet from rebound.idempotency.bench.toml: replica 3 of 3,")
    assert 'listen = "127.0.0.1:18083"' in text and 'listen = "127.0.0.1:19903"' in text
    assert "18080" not in text and "19901" not in text
    assert text.endswith('\n[redis]\nurl = "redis://127.0.0.1:16380/0"\n')
    with pytest.raises(BenchError, match="to put replica 1's port in"):
        fleet_config_text("[server]\n", 1, "")
