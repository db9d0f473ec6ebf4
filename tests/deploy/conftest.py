"""Fixtures for tests/deploy: a built rebound, a fake upstream, Redis, and a rebound exercised so
that every metric family it can export has a sample (families with labels appear on /metrics only
once they have one)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from deploy_support import REBOUND_BIN, ROOT, FakeUpstream, Rebound, Redis


@pytest.fixture(scope="session")
def rebound_bin() -> Path:
    """target/debug/rebound, built with `cargo build` (a no-op when scripts/test built it already).
    REBOUND_BIN names a binary to use instead, without building."""
    if "REBOUND_BIN" not in os.environ:
        subprocess.run(["cargo", "build", "--locked", "--bin", "rebound"], cwd=ROOT, check=True)
    assert REBOUND_BIN.exists(), REBOUND_BIN
    return REBOUND_BIN


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("deploy")


@pytest.fixture(scope="session")
def fake():
    f = FakeUpstream()
    yield f
    f.stop()


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path / "redis")
    yield r
    r.stop()


# Keys for the `signed` upstream (the AWS chain's first source), and no other AWS source.
EXERCISE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIDEXERCISE",
    "AWS_SECRET_ACCESS_KEY": "exercise-secret",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
}


def exercise_config(fake_url: str, redis_url: str) -> str:
    return f"""
[server]
listen = "127.0.0.1:0"

[admin]
listen = "127.0.0.1:0"

[log]
format = "text"
level = "info"

[redis]
url = "{redis_url}"
key_prefix = "deploy-test:"

[upstreams.fake]
url = "{fake_url}"

[upstreams.breaker]
url = "{fake_url}"
circuit = "fast"

[upstreams.limited]
url = "{fake_url}"
cooldown = "reject"

# An adaptive concurrency limit (docs/concurrency.md): the rebound_concurrency_* series.
[upstreams.adaptive]
url = "{fake_url}"
concurrency = "adaptive"

# SigV4 with keys from the environment (EXERCISE_AWS_ENV): the credential metrics are exported.
[upstreams.signed]
url = "{fake_url}"
auth = "aws"
aws_region = "us-east-1"

[[routes]]
name = "llm"
path_prefix = "/llm/"
upstream = "fake"
strip_prefix = true
retry = "fast"
idempotency = "idem"
dead_letters = true
continue_streams = true

[[routes]]
name = "nobudget"
path_prefix = "/nobudget/"
upstream = "fake"
strip_prefix = true
retry = "nobudget"
dead_letters = true

[[routes]]
name = "breaker"
path_prefix = "/breaker/"
upstream = "breaker"
strip_prefix = true
dead_letters = true

[[routes]]
name = "limited"
path_prefix = "/limited/"
upstream = "limited"
strip_prefix = true

[[routes]]
name = "spread"
path_prefix = "/spread/"
targets = [{{ upstream = "fake", weight = 3 }}, {{ upstream = "limited" }}]
balance = "weighted"
strip_prefix = true

[[routes]]
name = "adaptive"
path_prefix = "/adaptive/"
upstream = "adaptive"
strip_prefix = true

[[routes]]
name = "signed"
path_prefix = "/signed/"
upstream = "signed"
strip_prefix = true

[[routes]]
name = "cached"
path_prefix = "/cached/"
upstream = "fake"
strip_prefix = true
cache = "demo"

# A team's requests and tokens per minute (docs/limits.md): the rebound_limit_* series.
[[routes]]
name = "team"
path_prefix = "/team/"
upstream = "fake"
strip_prefix = true
limits = ["team"]

[retry.fast]
max_attempts = 3
base_delay = "1ms"
max_delay = "5ms"
max_retry_after = "2s"
retry_on = ["connect-failure", "reset", "timeout", "429", "502", "503", "504"]

[retry.nobudget]
max_attempts = 3
base_delay = "1ms"
max_delay = "5ms"
retry_on = ["503"]
budget_ratio = 0.0
budget_min_per_second = 0

[circuit.fast]
consecutive_failures = 2
minimum_requests = 1
open_for = "60s"
max_open_for = "60s"
failure_on = ["connect-failure", "5xx"]

[idempotency.idem]
on_store_error = "fail_closed"

[cache.demo]
ttl = "1h"

[limits.team]
key = "header:x-team"
requests_per_minute = 2
tokens_per_minute = 100000
on_limit = "reject"
"""


class Exercised:
    """A running rebound after the exercise, and what /metrics showed."""

    def __init__(self, rebound: Rebound, scrape: str, log: list[str]):
        self.rebound = rebound
        self.scrape = scrape
        self.log = log


@pytest.fixture(scope="session")
def exercised(rebound_bin, workdir, fake):
    """Starts Redis and rebound, sends requests that touch every feature (retries with backoff and
    with Retry-After, attempts used up, a spent budget, an opening circuit, a cooldown, idempotent
    store and replay, a response cache miss and hit, a team's limit, a config reload), then stops
    Redis (Redis errors, store errors) and scrapes.
    rebound keeps running for the Prometheus test."""
    redis = Redis(workdir / "exercise-redis")
    try:
        rebound = Rebound(workdir / "exercise-rebound", exercise_config(fake.url, redis.url), env=EXERCISE_AWS_ENV)
    except BaseException:
        redis.stop()
        raise
    log: list[str] = []
    run = uuid.uuid4().hex[:8]

    def call(method, path, headers=None, body=None):
        status, h, _ = rebound.request(method, path, body, headers)
        cache = f", cache {h['x-rebound-cache']}" if "x-rebound-cache" in h else ""
        log.append(f"{method} {path} -> {status} (attempts {h.get('x-rebound-attempts')}, error {h.get('x-rebound-error')}{cache})")
        return status, h

    try:
        assert call("GET", "/llm/ok")[0] == 200
        key = {"Idempotency-Key": f"exercise-{run}", "content-type": "application/json"}
        call("POST", "/llm/ok", key, b"{}")
        call("POST", "/llm/ok", key, b"{}")  # replayed
        call("GET", f"/llm/flaky/{run}")  # one retry after a backoff
        call("GET", f"/llm/flaky-hint/{run}")  # one retry after the provider's retry-after-ms
        call("GET", "/llm/fail")  # attempts used up; a dead letter
        call("GET", "/nobudget/fail")  # the retry is refused by the budget
        for _ in range(4):
            call("GET", "/breaker/fail")  # the circuit opens, then refuses
        cred = {"authorization": "Bearer exercise-credential"}
        call("GET", "/limited/ratelimit", cred)  # 429 with retry-after: a cooldown for this credential
        call("GET", "/limited/ok", cred)  # refused by the cooldown
        call("GET", "/nowhere")  # no route
        call("GET", "/signed/ok")  # signed with SigV4 (auth = "aws")
        call("GET", "/adaptive/ok")  # under an adaptive concurrency limit: its scope made
        call("GET", "/adaptive/fail")  # a 503: the limit shrinks (an adjustment down)
        # The same chat completion twice on the cached route: a miss (stored), then a hit (no
        # upstream call; the stored usage counts as tokens saved).
        chat = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": run}]}).encode()
        json_body = {"content-type": "application/json"}
        call("POST", "/cached/v1/chat/completions", json_body, chat)
        call("POST", "/cached/v1/chat/completions", json_body, chat)
        # A team's limit: two admitted (tokens reserved, then settled from the usage), the third
        # refused with 429 limit_exceeded (in the same minute; across a minute's end, admitted).
        team = {**json_body, "x-team": f"exercise-{run}"}
        for _ in range(3):
            call("POST", "/team/v1/chat/completions", team, chat)
        # A reload (the file watcher sees a changed file; a build without it just carries on).
        rebound.config_path.write_text(rebound.config_path.read_text() + "\n# reloaded\n")
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and "rebound_config_reloads_total" not in rebound.metrics():
            time.sleep(0.2)
        # Redis goes away: the idempotent request fails closed, the health check fails.
        redis.stop()
        call("POST", "/llm/ok", {**key, "Idempotency-Key": f"exercise-down-{run}"}, b"{}")
        # The cache fails open: forwarded, a miss counted as store_error.
        call("POST", "/cached/v1/chat/completions", json_body, chat)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "rebound_redis_up 0" not in rebound.metrics():
            time.sleep(0.2)
        rebound.process.assert_alive("rebound")
        yield Exercised(rebound, rebound.metrics(), log)
    finally:
        rebound.stop()
        redis.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failure, add what the exercised rebound was sent and its log tail to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    fx = getattr(item, "funcargs", {}).get("exercised")
    if fx is not None:
        report.sections.append(("exercised rebound: requests", "\n".join(fx.log)))
        report.sections.append(("exercised rebound: log tail", fx.rebound.process.tail()))
