"""Tables as printed: alignment, formats, ratio columns, warnings."""

from benchkit.body import body_aggregates, body_table
from benchkit.c1 import c1_table
from benchkit.forward import forward_table
from benchkit.idempotency import idem_table
from benchkit.render import columns_table, format_table, metric_header, noise_warning


def test_format_table():
    rows = [["metric", "a", "bb"], ["x", "1", "22"], ["longer", "333", "4"]]
    assert format_table(rows) == (
        "metric    a  bb\n"
        "------  ---  --\n"
        "x         1  22\n"
        "longer  333   4")
    assert format_table(rows, left=2).splitlines()[2] == "x       1    22"


def test_columns_table_with_a_ratio_column():
    spec = [("CPU (us)", "cpu", "{:.1f}", 1), ("RSS (MiB)", "rss", "{:.1f}", 1 / 1024), ("lost", "lost", "{:.0f}", 1)]
    agg = {"a": {"cpu": 20.0, "rss": 2048, "lost": 0}, "b": {"cpu": 25.0, "lost": 3}}
    text = columns_table(["metric", "a", "b", "b/a"], spec, agg, ["a", "b"], ("b/a", "b", "a", {"cpu", "rss", "lost"}))
    assert text.splitlines() == [
        "metric        a     b   b/a",
        "---------  ----  ----  ----",
        "CPU (us)   20.0  25.0  1.25",
        "RSS (MiB)   2.0     -     -",  # no value on one side: no ratio
        "lost          0     3     -",  # a denominator of 0: no ratio
    ]


def forward_agg():
    """Medians of a forward run (numbers from bench/results.jsonl)."""
    direct = {"thr_rps": 122038.0, "lat_p50_ms": 0.056513, "lat_p99_ms": 0.248907, "lost": 0, "other_cpu_pct": 0.6}
    nginx = {"thr_rps": 84171.2, "thr_cpu_us_per_req": 10.6915, "thr_proxy_core_util": 0.899311, "lat_p50_ms": 0.237925,
             "added_p50_ms": 0.181412, "rss_idle_kib": 14392, "lost": 0, "other_cpu_pct": 0.5}
    rebound = {"thr_rps": 56107.6, "thr_cpu_us_per_req": 17.4636, "thr_proxy_core_util": 0.979041, "lat_p50_ms": 0.249801,
               "added_p50_ms": 0.193288, "rss_idle_kib": 8512, "lost": 2, "other_cpu_pct": 1.0}
    return {"direct": direct, "nginx": nginx, "rebound": rebound}


def test_forward_table():
    lines = forward_table(forward_agg(), ["direct", "nginx", "rebound"], 5).splitlines()
    # the first column is as wide as the longest label, "other processes' CPU, worst phase (%)"
    assert lines[0].startswith("metric (median of 5)".ljust(37) + "  ")
    assert lines[1].startswith("-" * 37 + "  ")
    assert lines[0].split()[-4:] == ["direct", "nginx", "rebound", "rebound/nginx"]
    rows = {line[:38].strip(): line[38:].split() for line in lines[2:]}
    assert rows["throughput c=64 (req/s)"] == ["122038", "84171", "56108", "0.67"]
    assert rows["proxy CPU per request @c64 (us)"] == ["-", "10.7", "17.5", "1.63"]
    assert rows["proxy core busy @c64 (%)"] == ["-", "90", "98", "1.09"]
    assert rows["latency p50 @1k rps (ms)"] == ["0.057", "0.238", "0.250", "1.05"]
    assert rows["RSS idle (MiB)"] == ["-", "14.1", "8.3", "0.59"]
    assert rows["lost: errors+non-2xx+incomplete"] == ["0", "0", "2", "-"]
    assert rows["other processes' CPU, worst phase (%)"] == ["1", "0", "1", "-"]
    assert len(lines) == 2 + 23


def test_forward_table_without_nginx_has_no_ratio():
    agg = forward_agg()
    del agg["nginx"]
    lines = forward_table(agg, ["direct", "rebound"], 1).splitlines()
    assert lines[0].split() == ["metric", "direct", "rebound"]


def test_idem_table_ratio_is_full_over_empty():
    agg = {"empty": {"idem_cpu_us_per_req": 30.0, "idem_requests": 45000}, "full": {"idem_cpu_us_per_req": 33.0}}
    lines = idem_table(agg, 1).splitlines()
    assert lines[0].split() == ["metric", "store", "empty", "store", "full", "full/empty"]
    assert lines[2].split()[-3:] == ["45000", "-", "-"]
    assert lines[4].split()[-3:] == ["30.0", "33.0", "1.10"]


def test_c1_table():
    agg = {"direct": {"c1_requests": 750485, "c1_p50_ms": 0.01, "c1_p99_ms": 0.034, "lost": 0},
           "rebound": {"c1_requests": 44993, "c1_p50_ms": 0.175, "c1_p99_ms": 0.325, "c1_added_p50_ms": 0.165,
                       "c1_added_p99_ms": 0.291, "c1_cpu_us_per_req": 78.0121, "c1_vol_switches_per_req": 1.96,
                       "c1_invol_switches_per_req": 0.041, "lost": 0}}
    assert c1_table(agg, ["direct", "rebound"]).splitlines() == [
        "target   requests  p50 (ms)  p99 (ms)  added p50 (ms)  added p99 (ms)  CPU/req (us)  switches/req vol + invol  lost",
        "-------  --------  --------  --------  --------------  --------------  ------------  ------------------------  ----",
        "direct     750485     0.010     0.034               -               -             -                         -     0",
        "rebound     44993     0.175     0.325           0.165           0.291          78.0               1.96 + 0.04     0",
    ]


def test_body_table_adds_latency_over_direct():
    runs_of = {(s, n): [] for s in ("1KiB", "256KiB", "1MiB", "4MiB") for n in ("direct", "rebound")}
    runs_of[("1KiB", "direct")] = [{"body_requests": 100, "body_p50_ms": 0.1}, {"body_requests": 120, "body_p50_ms": 0.3}]
    runs_of[("1KiB", "rebound")] = [{"body_requests": 90, "body_p50_ms": 0.45, "body_cpu_us_per_req": 80.0, "lost": 0}]
    aggs = body_aggregates(runs_of, ["direct", "rebound"])
    assert aggs[("1KiB", "direct")]["body_p50_ms"] == 0.2 and "body_added_p50_ms" not in aggs[("1KiB", "direct")]
    assert round(aggs[("1KiB", "rebound")]["body_added_p50_ms"], 6) == 0.25
    assert list(aggs)[:3] == [("1KiB", "direct"), ("1KiB", "rebound"), ("256KiB", "direct")]
    lines = body_table(aggs).splitlines()
    assert lines[0].startswith("body    target   requests")
    assert lines[3] == "1KiB    rebound        90     0.450         -           0.250          80.0     0"
    assert lines[4] == "256KiB  direct          -         -         -               -             -     -"


def test_noise_warning_and_header():
    assert noise_warning(10.0) is None
    assert noise_warning(12.4) == ("\nWARNING: processes outside the benchmark used up to 12% of a core during a "
                                   "measured phase: the machine was not quiet, treat these numbers as noisy.")
    assert noise_warning(40, quiet_clause=False).endswith("measured phase: treat these numbers as noisy.")
    assert metric_header(1) == "metric" and metric_header(3) == "metric (median of 3)"


def test_spread_busiest_share():
    from benchkit.spread import busiest_share
    assert busiest_share({"1": 1.0, "2": 1.0}, {"1": 2.0, "2": 2.0}) == 0.5
    assert busiest_share({"1": 1.0}, {"1": 4.0, "2": 1.0}) == 0.75  # a thread born in the phase counts whole
    assert busiest_share({"1": 1.0}, {"1": 1.0}) is None
