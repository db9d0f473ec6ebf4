"""Per-request figures and the aggregation over runs."""

import pytest

from benchkit.stats import aggregate, ms, per, ratio


def test_per_and_ms():
    assert per(2.0, 100_000) == pytest.approx(20.0)  # 2 s of CPU over 100,000 requests: 20 us each
    assert per(3, 4, 1) == 0.75
    assert per(None, 10) is None and per(1.0, 0) is None and per(1.0, None) is None
    assert ms(0.000249801) == pytest.approx(0.249801)
    assert ms(None) is None


def test_ratio():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(0.0, 2.0) == 0.0
    assert ratio(None, 2.0) is None and ratio(1.0, 0) is None and ratio(1.0, None) is None


def test_aggregate_medians_sums_and_worst():
    runs = [
        {"thr_rps": 50000.0, "lat_p99_ms": 0.7, "lost": 1, "thr_errors": 0, "lat_upstream_mismatch": 2,
         "other_cpu_pct": 1.0, "thr_steal_pct": 0.5, "target": "rebound", "ok": True, "kinds": {"timeout": 1}},
        {"thr_rps": 56000.0, "lat_p99_ms": 0.6, "lost": 0, "thr_errors": 3, "lat_upstream_mismatch": -1,
         "other_cpu_pct": 12.0, "thr_steal_pct": 0.1, "target": "rebound", "ok": False},
        {"thr_rps": 52000.0, "lat_p99_ms": None, "lost": 4, "thr_errors": 0, "lat_upstream_mismatch": 0,
         "other_cpu_pct": 3.0, "thr_steal_pct": 2.5},
    ]
    agg = aggregate(runs)
    assert agg["thr_rps"] == 52000.0  # median
    assert agg["lat_p99_ms"] == pytest.approx(0.65)  # median of the runs that have it
    assert agg["lost"] == 5 and agg["thr_errors"] == 3  # failure counts: summed
    assert agg["lat_upstream_mismatch"] == 1  # *_mismatch: summed
    assert agg["other_cpu_pct"] == 12.0 and agg["thr_steal_pct"] == 2.5  # noise: the worst run
    assert "target" not in agg and "ok" not in agg and "kinds" not in agg  # only numbers, not bools


def test_aggregate_of_nothing():
    assert aggregate([]) == {}
    assert aggregate([{"a": None}]) == {}
