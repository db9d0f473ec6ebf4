"""Each mode's numbers from the load generators' summaries and a phase's CPU accounting."""

import types

import pytest

from benchkit import c1, cache, follow, forward, idempotency, policy
from benchkit.loadgen import parse_wrk
from samples import WRK_STDOUT, oha_json, phase, sse_json


def test_throughput_metrics():
    m = forward.throughput_metrics(parse_wrk(WRK_STDOUT), phase(cpu_s=9.8, sched_s=9.9, other_cpu_pct=0.4))
    assert m["thr_requests"] == 561076
    assert m["thr_rps"] == pytest.approx(56107.53, abs=0.01)
    assert m["thr_cpu_us_per_req"] == pytest.approx(9.8 / 561076 * 1e6)
    assert m["thr_proxy_core_util"] == pytest.approx(0.98)
    assert (m["thr_p50_ms"], m["thr_p99_ms"]) == (1.106, 1.874)
    assert (m["thr_errors"], m["thr_non2xx"], m["thr_load_core_busy_pct"], m["thr_other_cpu_pct"]) == (4, 2, 95.0, 0.4)


def test_latency_metrics():
    m = forward.latency_metrics(oha_json(), phase(cpu_s=0.8), received=20003)
    assert m["lat_requests"] == 20000 and m["lat_non2xx"] == 2 and m["lat_errors"] == 2
    assert m["lat_p50_ms"] == pytest.approx(0.249801) and m["lat_p999_ms"] == pytest.approx(2.05035)
    assert m["lat_max_ms"] == pytest.approx(4.127)
    assert m["lat_cpu_us_per_req"] == pytest.approx(0.8 / 19996 * 1e6)  # per 2xx response
    assert m["lat_upstream_mismatch"] == 3
    assert forward.latency_metrics(oha_json(), phase(cpu_s=None), None)["lat_upstream_mismatch"] is None


def test_sse_metrics_and_totals():
    m = forward.sse_metrics(sse_json(), phase(cpu_s=0.35, other_cpu_pct=3.0), received=1001)
    assert (m["sse_streams"], m["sse_incomplete"], m["sse_non2xx"]) == (1000, 1, 0)
    assert m["sse_ttfb_p50_ms"] == 2.187 and m["sse_total_p99_ms"] == 240.118
    assert m["sse_ttfb_p50_ms_by_round"][0] == 4.102
    assert m["sse_cpu_us_per_stream"] == pytest.approx(350.0)
    assert m["sse_upstream_mismatch"] == 1
    m.update(thr_other_cpu_pct=1.0, lat_other_cpu_pct=12.0, thr_errors=4, thr_non2xx=2, lat_errors=2, lat_non2xx=2)
    forward.totals(m)
    assert m["other_cpu_pct"] == 12.0 and m["lost"] == 4 + 2 + 2 + 2 + 1


def test_added_vs_direct_and_order():
    results = {"direct": {"lat_p50_ms": 0.05, "lat_p99_ms": 0.25, "lat_p999_ms": None},
               "rebound": {"lat_p50_ms": 0.25, "lat_p99_ms": 0.65, "lat_p999_ms": 2.0}}
    forward.added_vs_direct(results)
    assert results["rebound"]["added_p50_ms"] == pytest.approx(0.2)
    assert results["rebound"]["added_p99_ms"] == pytest.approx(0.4)
    assert results["rebound"]["added_p999_ms"] is None
    assert results["direct"]["added_p50_ms"] is None
    targets = ["direct", "nginx", "rebound", "hyper-floor"]
    assert forward.run_order(targets, 0) == ["direct", "nginx", "rebound", "hyper-floor"]
    assert forward.run_order(targets, 1) == ["direct", "hyper-floor", "rebound", "nginx"]
    assert forward.run_order(["nginx", "rebound"], 3) == ["rebound", "nginx"]


def wrk(p50_us, p99_us, **over):
    w = {"requests": 9000, "duration_us": 1_500_000, "connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0,
         "p50_us": p50_us, "p99_us": p99_us}
    w.update(over)
    return w


def test_idempotency_sums_and_ratios():
    acc = {st: idempotency.new_acc() for st in idempotency.STATES}
    for p50, cpu in ((700, 0.27), (900, 0.29), (800, 0.28)):
        idempotency.add_phase(acc["empty"], 9000, wrk(p50, 2000), phase(cpu_s=cpu, sched_s=cpu, wall_s=1.5), 9010)
    for p50, cpu in ((1000, 0.30), (1200, 0.33), (1100, 0.327)):
        idempotency.add_phase(acc["full"], 9000, wrk(p50, 2500, read=1, status=2), phase(cpu_s=cpu, sched_s=cpu,
                              wall_s=1.5, other_cpu_pct=4.0), 9012)
    out = idempotency.idem_metrics(acc, 12000, 3)
    e, f = out["empty"], out["full"]
    assert e["idem_requests"] == 27000 and e["idem_upstream_received"] == 27030 and e["idem_prefill"] == 0
    assert e["idem_cpu_us_per_req"] == pytest.approx(0.84 / 27000 * 1e6)
    assert e["idem_rps"] == pytest.approx(27000 / 4.5)
    assert (e["idem_p50_ms"], e["idem_p99_ms"], e["lost"]) == (0.8, 2.0, 0)
    assert (f["idem_prefill"], f["idem_errors"], f["idem_non2xx"], f["lost"], f["other_cpu_pct"]) == (12000, 3, 6, 9, 4.0)
    assert f["idem_cpu_full_over_empty"] == pytest.approx(0.957 / 0.84)
    assert "idem_cpu_full_over_empty" not in e


def keyed(answered, sent, **over):
    w = wrk(600, 1800, requests=answered, duration_us=10_000_000, sent=sent, answered=answered, non2xx=0,
            attempts_other=0, attempts_missing=0)
    w.update(over)
    return w


def test_policy_one_call_per_request():
    m = policy.policy_metrics("policy", keyed(300000, 300064), phase(cpu_s=6.0), received=300010, rss=9000)
    assert m["policy_one_call_per_request"] == 1
    assert (m["policy_abandoned"], m["policy_upstream_extra"], m["policy_lost"]) == (64, 10, 0)
    assert m["policy_cpu_us_per_req"] == pytest.approx(20.0) and m["policy_rps"] == 30000.0
    retried = policy.policy_metrics("policy", keyed(300000, 300064, attempts_other=5), phase(), 300010, 9000)
    assert retried["policy_one_call_per_request"] == 0
    twice = policy.policy_metrics("policy", keyed(300000, 300064), phase(), 300100, 9000)
    assert twice["policy_one_call_per_request"] == 0
    plain = policy.policy_metrics("plain", keyed(300000, 300064, read=2, non2xx=1), phase(cpu_s=4.8), None, 9000)
    assert plain["policy_lost"] == 3 and plain["policy_upstream_extra"] is None
    warnings = policy.policy_checks({"plain": plain, "policy": retried})
    assert warnings == ["plain: 2 socket errors, 1 responses not 2xx",
                        "policy: upstream calls 300010 not within answered 300000 .. sent 300064, or 5 responses "
                        "with x-rebound-attempts != 1"]
    r = policy.policy_ratios(plain, m)
    assert r["policy_cpu_us_per_req_over_plain"] == pytest.approx(1.25)


def test_cache_metrics_and_phase_order():
    args = types.SimpleNamespace(cache_store="redis", hit_ratio=0.9)
    m = cache.cache_metrics(args, "cached", wrk(300, 900, requests=100000, status=1), phase(cpu_s=1.2),
                            received=10250, redis_per_req=2.5, scripts_per_req=1.0)
    assert m["cache_hit_ratio_seen"] == pytest.approx(0.8975)
    assert m["cache_cpu_us_per_req"] == pytest.approx(12.0) and m["cache_rps"] == 10000.0
    assert (m["cache_store"], m["lost"], m["cache_redis_round_trips_per_req"]) == ("redis", 1, 1.0)
    assert cache.cache_metrics(args, "uncached", wrk(1, 1, requests=0), phase(), 0, None, None)["cache_store"] is None
    assert cache.phase_order("r0", "uncached", "cached") == ["uncached", "cached"]
    assert cache.phase_order("r3", "uncached", "cached") == ["cached", "uncached"]
    assert cache.phase_order("r12", "a", "b") == ["a", "b"]


def test_follow_metrics():
    m = follow.follow_metrics(sse_json(), phase(cpu_s=0.12), received=5, idle=8000, peak=9024)
    assert m["follow_upstream_received"] == 5 and m["follow_cpu_us_per_stream"] == pytest.approx(120.0)
    assert (m["rss_added_kib"], m["lost"]) == (1024, 1)
    assert follow.follow_metrics(sse_json(), phase(), 5, None, 9024)["rss_added_kib"] is None


def test_c1_order_and_added_latency():
    assert c1.alternate(["direct", "a", "b", "c"], 0) == ["direct", "a", "b", "c"]
    assert c1.alternate(["direct", "a", "b", "c"], 1) == ["direct", "c", "b", "a"]
    results = {"direct": c1.c1_metrics("direct", wrk(10, 34), phase(cpu_s=None)),
               "rebound": c1.c1_metrics("rebound", wrk(175, 325, status=1), phase(cpu_s=0.7))}
    c1.added_over_direct(results)
    assert results["rebound"]["c1_added_p50_ms"] == pytest.approx(0.165)
    assert results["rebound"]["c1_added_p99_ms"] == pytest.approx(0.291)
    assert results["rebound"]["lost"] == 1 and results["rebound"]["c1_cpu_us_per_req"] == pytest.approx(77.78, abs=0.01)
    assert "c1_added_p50_ms" not in results["direct"] and results["direct"]["c1_cpu_us_per_req"] is None

