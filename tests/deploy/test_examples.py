"""config/examples: every example passes `rebound check`, and the "LLM call, store the result, email
the user" pipeline does what docs/deployment.md says, run for real against a fake email provider
and OpenAI (the example's upstream URLs pointed at a local fake, nothing else changed)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest

from deploy_support import ROOT, Rebound

EXAMPLES = sorted((ROOT / "config/examples").glob("*.toml"))
# Provider keys "set", as tests/it/config_files.rs does; everything else takes its default.
KEYS = {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY", "EMAIL_PROVIDER_API_KEY"}


def test_the_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"fleet-redis.toml", "multi-provider-fallback.toml", "llm-email-pipeline.toml"} <= names, names
    doc = (ROOT / "docs/deployment.md").read_text()
    for p in EXAMPLES:
        assert f"config/examples/{p.name}" in doc, f"docs/deployment.md does not mention {p.name}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_rebound_check(rebound_bin, path):
    needed = set(re.findall(r"\$\{(\w+)\}", path.read_text()))
    assert needed <= KEYS, f"{path.name} needs {sorted(needed - KEYS)} without a default"
    env = {"PATH": "/usr/bin:/bin", **{k: f"test-{k}" for k in KEYS}}
    r = subprocess.run([rebound_bin, "check", "--config", path], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "test-" not in r.stdout, "a key leaked into `rebound check`"


def test_fallback_example_pairs_openai_and_azure(rebound_bin):
    path = ROOT / "config/examples/multi-provider-fallback.toml"
    env = {"PATH": "/usr/bin:/bin", **{k: "k" for k in KEYS}}
    out = subprocess.run([rebound_bin, "check", "--config", path], capture_output=True, text=True, env=env, check=True).stdout
    # `fallback` is the ordered case of targets: `rebound check` shows the targets.
    # Azure OpenAI is another shape of the OpenAI API: each request is adapted to the target's.
    assert re.search(r"/openai/\s+openai\s+-> openai .*targets \[openai, azure as azure-openai\], balance ordered", out), out
    assert re.search(
        r"/azure/\s+azure\s+-> azure \(https://my-resource\.openai\.azure\.com/openai\), api azure-openai.*"
        r"targets \[azure, openai as openai\]",
        out,
    ), out
    assert re.search(r"/anthropic/\s+anthropic\s+-> anthropic", out), out
    for upstream in ("openai", "azure"):
        assert re.search(rf"^  {upstream}\s+https://\S+ .*circuit provider", out, re.M), f"{upstream} needs a circuit for fallback"


def test_email_retry_policy_is_short_and_never_retries_a_maybe_sent_email(rebound_bin):
    path = ROOT / "config/examples/llm-email-pipeline.toml"
    env = {"PATH": "/usr/bin:/bin", **{k: "k" for k in KEYS}}
    out = subprocess.run([rebound_bin, "check", "--config", path], capture_output=True, text=True, env=env, check=True).stdout
    (line,) = [l for l in out.splitlines() if l.strip().startswith("email ") and "attempts" in l]
    assert "3 attempts, backoff 1s..10s" in line, line
    assert "retry_on [connect-failure,refused-stream,503]" in line, line
    assert "non_idempotent safe-only" in line, line  # the config's own spelling
    assert re.search(r"/email/\s+email\s+-> email \(https://api\.emailprovider\.example\).*idempotency job", out), out
    assert re.search(r"^  job\s+header idempotency-key, required", out, re.M), out


@pytest.fixture
def pipeline(rebound_bin, fake, redis, tmp_path):
    """rebound on the pipeline example, its upstreams pointed at the fake, its Redis a fresh one."""
    text = (ROOT / "config/examples/llm-email-pipeline.toml").read_text()
    for url in ("https://api.emailprovider.example", "https://api.openai.com"):
        assert f'url = "{url}"' in text
        text = text.replace(f'url = "{url}"', f'url = "{fake.url}"')
    env = {
        "REBOUND_LISTEN": "127.0.0.1:0",
        "REBOUND_ADMIN_LISTEN": "127.0.0.1:0",
        "REDIS_URL": redis.url,
        "OPENAI_API_KEY": "sk-test-openai",
        "EMAIL_PROVIDER_API_KEY": "test-email-key",
    }
    r = Rebound(tmp_path / "rebound", text, env=env, name="llm-email-pipeline.toml")
    yield r
    r.stop()


def send_email(pipeline, key: str | None, mode: str | None = None):
    headers = {"content-type": "application/json", "authorization": "Bearer app-placeholder"}
    if key:
        headers["Idempotency-Key"] = key
    if mode:
        headers["x-fake-status"] = mode
    body = json.dumps({"to": "user@example.com", "subject": "Your summary is ready", "job": key}).encode()
    return pipeline.request("POST", "/email/v3/send", body, headers)


def test_email_pipeline_sends_one_email_per_job(pipeline, fake):
    job = f"job-{uuid.uuid4().hex[:12]}"

    def sends(key):
        return fake.calls(lambda r: r["path"] == "/v3/send" and r["headers"].get("idempotency-key") == key)

    # Step 1, the LLM call, twice (the job ran again): one generation.
    llm_key = f"{job}:llm"
    chat = json.dumps({"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "summarise"}]}).encode()
    for _ in range(2):
        status, h, _ = pipeline.request("POST", "/openai/v1/chat/completions", chat,
                                        {"content-type": "application/json", "Idempotency-Key": llm_key})
        assert status == 200, (status, h)
    assert len(fake.calls(lambda r: r["headers"].get("idempotency-key") == llm_key)) == 1

    # Step 3, the email, twice: one send; the second answer is the first one replayed.
    key = f"{job}:email"
    status, h, body = send_email(pipeline, key)
    assert status == 200, (status, h, body)
    assert h.get("idempotent-replayed") is None
    status2, h2, body2 = send_email(pipeline, key)
    assert (status2, body2) == (status, body)
    assert h2.get("idempotent-replayed") == "true" and h2.get("x-rebound-attempts") == "0"
    (sent,) = sends(key)
    assert sent["headers"]["authorization"] == "Bearer test-email-key", "the sidecar's key replaces the app's"
    assert sent["headers"]["idempotency-key"] == key, "the key is forwarded for providers that honour it"


def test_email_without_a_job_key_is_refused(pipeline, fake):
    before = len(fake.calls(lambda r: r["path"] == "/v3/send"))
    status, h, body = send_email(pipeline, None)
    assert status == 400 and h.get("x-rebound-error") == "idempotency_key_required", (status, h, body)
    assert len(fake.calls(lambda r: r["path"] == "/v3/send")) == before


def test_email_503_is_retried_once_then_replayed(pipeline, fake):
    key = f"job-{uuid.uuid4().hex[:12]}:email"
    status, h, _ = send_email(pipeline, key, "503-once")
    assert status == 202 and h.get("x-rebound-attempts") == "2", (status, h)
    status, h, _ = send_email(pipeline, key, "503-once")
    assert status == 202 and h.get("idempotent-replayed") == "true"
    assert len(fake.calls(lambda r: r["headers"].get("idempotency-key") == key)) == 2  # the 503, then the send


@pytest.mark.parametrize("code", ["400", "429", "500", "504"])
def test_email_failures_that_may_have_sent_or_will_fail_again_are_not_retried(pipeline, fake, code):
    """4xx: no retry (the job queue decides). 500/504: the provider may have sent the email."""
    key = f"job-{uuid.uuid4().hex[:12]}:email"
    status, h, _ = send_email(pipeline, key, code)
    assert status == int(code) and h.get("x-rebound-attempts") == "1", (status, h)
    assert h.get("x-should-retry") == "false"
    # Not stored: the job's own retry runs (and the provider's dedupe, if any, sees the same key).
    send_email(pipeline, key, code)
    assert len(fake.calls(lambda r: r["headers"].get("idempotency-key") == key)) == 2
