"""deploy/prometheus: the alert rules pass `promtool check rules` and their unit tests, and a real
Prometheus server (Debian's `prometheus`, run directly on a temp config and storage dir) scrapes a
running rebound: the target is up, rebound's metrics are queryable, the rules evaluate without
errors, and every dashboard query runs and (where its metrics are exported) returns series."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from test_metric_names import NOT_YET_EXPORTED
from deploy_support import (
    ROOT,
    Process,
    dashboard_expressions,
    dashboard_variables,
    exported_families,
    family_of,
    free_port,
    grafana_to_promql,
    http,
    need_tool,
    promql_metric_names,
    wait_until,
)

PDIR = ROOT / "deploy/prometheus"
RULES = PDIR / "rebound.rules.yml"
RULES_TEST = PDIR / "rebound.rules.test.yml"
DASHBOARD = ROOT / "deploy/grafana/rebound-dashboard.json"

PROMTOOL_HINT = "apt-get install prometheus (it ships promtool)"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([need_tool("promtool", PROMTOOL_HINT), *args], cwd=PDIR, capture_output=True, text=True)


def test_promtool_check_rules():
    r = promtool("check", "rules", RULES.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_rule_unit_tests():
    r = promtool("test", "rules", RULES_TEST.name)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_unit_test_and_a_runbook_entry():
    rules = yaml.safe_load(RULES.read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    tests = yaml.safe_load(RULES_TEST.read_text())
    tested = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    assert set(alerts) <= tested, f"alerts without a firing test case: {sorted(set(alerts) - tested)}"
    runbook = (ROOT / "docs/deployment.md").read_text()
    for g in rules["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
            doc, anchor = r["annotations"]["runbook"].split("#", 1)
            if doc == "docs/deployment.md":
                assert f"### {r['alert']}" in runbook, f"docs/deployment.md has no runbook section for {r['alert']}"
                assert anchor == r["alert"].lower()
            else:
                # A feature's own page may hold the runbook (docs/limits.md#when-a-limit-rejects):
                # the page exists and has a heading with that anchor.
                page = ROOT / doc
                assert page.is_file(), f"{r['alert']}: runbook {doc} does not exist"
                assert anchor in heading_anchors(page.read_text()), f"{r['alert']}: {doc} has no heading with the anchor #{anchor}"
    # The brief's list of conditions, each covered by an alert on the right metric.
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    for metric in ("rebound_circuit_state", "rebound_retries_total", "rebound_retry_budget_exhausted_total",
                   "rebound_dead_letters_depth", "rebound_dead_letters_total", "rebound_redis_errors_total",
                   "rebound_redis_up", 'rebound_idempotency_requests_total{result="store_error"}'):
        assert metric in exprs, metric


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces to `-`),
    code blocks skipped."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


class Prometheus:
    def __init__(self, workdir: Path, target: str):
        binary = need_tool("prometheus", "apt-get install prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "rebound", "static_configs": [{"targets": [target]}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process = Process(
            [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            workdir / "prometheus.log",
        )

        def ready():
            self.process.assert_alive("prometheus")
            return http("GET", self.url + "/-/ready", timeout=2)[0] == 200

        try:
            wait_until("Prometheus to be ready", ready)
        except BaseException as e:
            self.process.stop()
            raise AssertionError(f"{e}\nprometheus's log:\n{self.process.tail()}") from None

    def api(self, path: str, **params) -> dict:
        status, _, body = http("GET", f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        doc = json.loads(body)
        assert status == 200 and doc["status"] == "success", f"{path} {params}: {status} {doc}"
        return doc["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def stop(self):
        self.process.stop()


@pytest.fixture(scope="module")
def prometheus(exercised, tmp_path_factory):
    p = Prometheus(tmp_path_factory.mktemp("prometheus"), exercised.rebound.admin_addr)
    yield p
    p.stop()


def test_prometheus_scrapes_rebound(prometheus, exercised):
    def target_up():
        targets = prometheus.api("targets")["activeTargets"]
        return targets if targets and targets[0]["health"] == "up" else None

    (target,) = wait_until("the rebound target to be up", target_up)
    assert target["labels"]["job"] == "rebound"
    assert target["scrapeUrl"] == f"http://{exercised.rebound.admin_addr}/metrics"
    # The targets API reports a scrape's health before that scrape's samples are committed to the
    # head block, so the first `up` sample can lag the health by a moment: wait for it.
    up = wait_until("the up sample in Prometheus", lambda: prometheus.query('up{job="rebound"}'))
    assert up[0]["value"][1] == "1"
    info = wait_until("rebound_build_info in Prometheus", lambda: prometheus.query("rebound_build_info"))
    assert info[0]["metric"]["version"] and info[0]["value"][1] == "1"
    routes = {s["metric"]["route"] for s in prometheus.query("sum by (route) (rebound_requests_total)")}
    assert {"llm", "nobudget", "breaker", "limited"} <= routes, routes
    # Enough samples for rate() over the dashboard's interval.
    wait_until("two scrapes", lambda: prometheus.query("count_over_time(rebound_build_info[1m]) >= 2"))


def test_alert_rules_evaluate_against_real_data(prometheus):
    def evaluated():
        groups = prometheus.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") and r["health"] != "unknown" for r in rules) else None

    rules = wait_until("every rule to be evaluated", evaluated, timeout=20)
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    assert len(rules) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])


def test_dashboard_queries_run_in_prometheus(prometheus, exercised):
    """Each dashboard expression, its variables replaced, is valid PromQL that Prometheus runs;
    a panel query whose metrics rebound exports returns at least one series."""
    test_prometheus_scrapes_rebound(prometheus, exercised)
    dashboard = json.loads(DASHBOARD.read_text())
    variables = dashboard_variables(dashboard)
    families = exported_families(exercised.scrape)
    empty, checked = [], 0
    for where, expr in dashboard_expressions(dashboard):
        q = grafana_to_promql(expr, variables)
        assert "$" not in q.replace("${1}", ""), f"{where}: unreplaced variable in {q}"
        result = prometheus.query(q)
        names = {family_of(n, families) for n in promql_metric_names(expr)}
        # A query on a metric rebound does not export yet (test_metric_names.NOT_YET_EXPORTED, the
        # one tolerated gap) has nothing to show; every other panel query must show something.
        if where.startswith("panel") and not names & NOT_YET_EXPORTED:
            checked += 1
            if not result:
                empty.append((where, q))
    assert not empty, f"queries on exported metrics that return nothing: {empty}"
    assert checked >= 25, checked


def test_a_fresh_sidecar_gives_every_dashboard_metric_a_sample(rebound_bin, fake, redis, tmp_path):
    """Before any request, every rebound_* name the dashboard queries has a sample in a real
    Prometheus: the series the config determines are exported from startup at 0, so the panels
    (and rate(), increase(), absent()) have data on day one, not only after the first incident."""
    from conftest import EXERCISE_AWS_ENV, exercise_config
    from deploy_support import Rebound

    names: set[str] = set()
    for _, expr in dashboard_expressions(json.loads(DASHBOARD.read_text())):
        names |= promql_metric_names(expr)
    rebound = Rebound(tmp_path / "fresh-rebound", exercise_config(fake.url, redis.url), env=EXERCISE_AWS_ENV)
    prom = None
    try:
        prom = Prometheus(tmp_path / "prometheus-fresh", rebound.admin_addr)

        def missing() -> list[str]:
            return [n for n in sorted(names) if not prom.query(f'count({{__name__="{n}"}})')]

        try:
            wait_until("every dashboard metric in Prometheus", lambda: not missing(), timeout=30)
        except AssertionError:
            raise AssertionError(f"no sample on a fresh sidecar for: {missing()}") from None
    finally:
        if prom:
            prom.stop()
        rebound.stop()
