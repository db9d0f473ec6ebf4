"""The results file's lines."""

import json
import re

from benchkit.results import RunInfo, append_result, new_run_id, now_ts, tidy


def info():
    return RunInfo("20261205T101500Z-1a2b3c", "fc75cfa0123456789abc", True,
                   {"nproc": 2, "cpu_model": "AMD EPYC 7B13", "kernel": "6.1.0"}, {"wrk": "wrk 4.1.0"},
                   {"duration": 10, "mode": "forward"})


def test_tidy_rounds_floats_to_6_significant_digits():
    assert tidy(17.463612345) == 17.4636
    assert tidy(0.000123456789) == 0.000123457
    assert tidy({"a": [1.23456789, 2, None], "b": {"c": 98765.4321}, "d": "x", "e": True}) == {
        "a": [1.23457, 2, None], "b": {"c": 98765.4}, "d": "x", "e": True}


def test_record_has_the_shared_fields():
    line = info().record(ts="2026-12-05T10:20:00+00:00", run=2, runs=5, target="nginx",
                         url="http://127.0.0.1:18081/fake/v1/chat/completions", metrics={"thr_rps": 84171.2})
    assert sorted(line) == ["git_commit", "git_dirty", "machine", "metrics", "params", "run", "run_id", "runs",
                            "target", "tools", "ts", "url"]
    assert line["run_id"] == "20261205T101500Z-1a2b3c" and line["git_commit"] == "fc75cfa0123456789abc"
    assert line["git_dirty"] is True and line["params"] == {"duration": 10, "mode": "forward"}


def test_append_result_writes_one_sorted_json_line_each(tmp_path):
    path = tmp_path / "results.jsonl"
    append_result(path, {"target": "direct", "metrics": {"lat_p50_ms": 0.0565131234}, "run": 1})
    append_result(path, {"target": "nginx", "run": 1})
    lines = path.read_text().splitlines()
    assert lines[0] == '{"metrics": {"lat_p50_ms": 0.0565131}, "run": 1, "target": "direct"}'
    assert json.loads(lines[1]) == {"target": "nginx", "run": 1}


def test_headline():
    i = info()
    assert i.commit_label == "fc75cfa01234 (dirty)"
    assert i.headline("proxy on core 0, load+upstream on core 1") == (
        "\n20261205T101500Z-1a2b3c  commit fc75cfa01234 (dirty)  AMD EPYC 7B13, 2 cores; "
        "proxy on core 0, load+upstream on core 1")
    clean = RunInfo("r", "abc", False, {"nproc": 4}, {}, {})
    assert clean.headline("x") == "\nr  commit abc  ?, 4 cores; x"


def test_time_stamp_and_run_id_formats():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", now_ts())
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", new_run_id())
