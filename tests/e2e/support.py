"""Helpers for the end-to-end tests: processes, the fake provider's control API, configs, SDK calls.

Every process runs on 127.0.0.1 on a port picked by the kernel (port 0), its output goes to a file
under the test's temporary directory, and a finalizer stops it (SIGTERM, then SIGKILL).

The binaries are the debug builds in target/ (`cargo build --bin rebound --example fake-provider`,
which scripts/test runs first); REBOUND_BIN and FAKE_PROVIDER_BIN override them.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import anthropic
import openai

ROOT = Path(__file__).resolve().parents[2]
REBOUND_BIN = Path(os.environ.get("REBOUND_BIN", ROOT / "target/debug/rebound"))
FAKE_BIN = Path(os.environ.get("FAKE_PROVIDER_BIN", ROOT / "target/debug/examples/fake-provider"))

# Every call a test makes is bounded: no test can hang the suite.
SDK_TIMEOUT = 30.0
START_TIMEOUT = 20.0

# The SDKs must reach the loopback directly, whatever the environment says.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
for _var in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
    os.environ.pop(_var, None)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test run dies, even if it is killed (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Process:
    """A child process whose output goes to a file; `wait_for` polls that file for a line."""

    def __init__(self, argv: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None):
        self.argv = argv
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **env} if env else None,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT) -> re.Match:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            for line in self.text().splitlines():
                m = regex.search(line)
                if m:
                    return m
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}:\n{self.text()}")
            time.sleep(0.02)
        raise TimeoutError(f"{self.argv[0]}: no line matching {pattern!r} in {timeout}s:\n{self.text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._out.close()


class FakeProvider:
    """`target/debug/examples/fake-provider --record`, plain HTTP or TLS (`--tls-dir`)."""

    def __init__(self, workdir: Path, tls: bool):
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [str(FAKE_BIN), "--listen", "127.0.0.1:0", "--record"]
        if tls:
            argv += ["--tls-dir", str(workdir)]
        self.process = Process(argv, workdir / "fake-provider.log", workdir)
        try:
            m = self.process.wait_for(r"fake provider listening on (\S+)")
        except Exception:
            self.process.stop()
            raise
        # http://127.0.0.1:PORT, or https://localhost:PORT (the test certificate names localhost)
        self.url: str = m.group(1)
        self.ca_file: Path | None = workdir / "ca.pem" if tls else None
        self._ssl = ssl.create_default_context(cafile=str(self.ca_file)) if tls else None

    def _call(self, method: str, path: str, body: object | None = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10, context=self._ssl) as resp:
            return json.loads(resp.read())

    def script(self, key: str, steps: list[dict]) -> None:
        """The next answers for `key`, one step per request (then normal answers)."""
        self._call("POST", "/_fake/script", {"key": key, "steps": steps})

    def count(self, key: str) -> int:
        return self._call("GET", f"/_fake/count?key={key}")["count"]

    def requests(self, key: str) -> list[dict]:
        """Requests received for `key`, in order: method, path, query, headers (a list of pairs),
        body (a list of bytes), and `refused`: why the host of its path refused it (None: taken)."""
        return self._call("GET", f"/_fake/requests?key={key}")

    def aws_region(self, region: str) -> None:
        """Bedrock's signatures must be scoped to `region` (see tests/it/support/fake_hosts.rs)."""
        self._call("POST", "/_fake/aws", {"region": region})

    def stop(self) -> None:
        self.process.stop()


def status(code: int, headers: dict[str, str] | None = None, body: str | None = None) -> dict:
    step = {"kind": "status", "status": code, "headers": list((headers or {}).items())}
    if body is not None:
        step["body"] = body
    return step


def delay(ms: int) -> dict:
    return {"kind": "delay", "ms": ms}


def in_band_error(error_type: str) -> dict:
    """200 and an event stream whose first event is an error of this type (Anthropic-shaped on
    `/messages`, OpenAI-shaped elsewhere)."""
    return {"kind": "in_band_error", "error_type": error_type}


def mid_stream_error(after: int, error_type: str) -> dict:
    """The normal stream's first `after` frames, then an error event of this type."""
    return {"kind": "mid_stream_error", "after": after, "error_type": error_type}


# The fake provider's cloud hosts (tests/it/support/fake_hosts.rs): their error shapes and the
# event stream steps only Bedrock has.

# The keys a Bedrock request must be signed with (AWS's documentation example): rebound's
# environment, with `auth = "aws"`.
AWS_ACCESS_KEY = "AKIDEXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AWS_ENV = {"AWS_ACCESS_KEY_ID": AWS_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": AWS_SECRET}


def bedrock_error(
    code: int = 429,
    error_type: str = "ThrottlingException",
    message: str = "Too many requests, please wait before trying again.",
) -> dict:
    """Bedrock's error answer: `x-amzn-errortype` and `{"message": ..}`."""
    return status(
        code,
        {
            "content-type": "application/json",
            "x-amzn-errortype": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/",
        },
        json.dumps({"message": message}),
    )


def google_error(code: int = 429, status_name: str = "RESOURCE_EXHAUSTED", message: str = "Quota exceeded.") -> dict:
    """Google's error answer (Vertex AI, the Gemini API)."""
    return status(
        code,
        {"content-type": "application/json"},
        json.dumps({"error": {"code": code, "message": message, "status": status_name}}),
    )


def event_stream_exception(
    after: int, exception_type: str = "throttlingException", message: str = "Too many tokens, please wait."
) -> dict:
    """Bedrock's stream: the first `after` events (0: none), then an exception message, then the end."""
    return {"kind": "event_stream_exception", "after": after, "exception_type": exception_type, "message": message}


def bad_checksum(after: int) -> dict:
    """Bedrock's stream: the first `after` events, then one whose message checksum is broken."""
    return {"kind": "bad_checksum", "after": after}


def header(recorded: dict, name: str) -> str | None:
    for k, v in recorded["headers"]:
        if k.lower() == name.lower():
            return v
    return None


class Rebound:
    """`target/debug/rebound --config FILE`; the addresses come from its "rebound listening" log line."""

    def __init__(self, workdir: Path, config: str, env: dict[str, str] | None = None):
        """`env` is added to rebound's environment (e.g. the AWS keys of `auth = "aws"`)."""
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "rebound.toml"
        path.write_text(config)
        self.config = config
        argv = [str(REBOUND_BIN), "--config", str(path)]
        self.process = Process(argv, workdir / "rebound.log", workdir, env)
        try:
            m = self.process.wait_for(r'"message":"rebound listening"')
            line = json.loads(m.string)
        except Exception:
            self.process.stop()
            raise
        self.url = f"http://{line['proxy']}"
        self.admin = f"http://{line['admin']}"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.admin + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    def logs(self) -> str:
        return self.process.text()

    def stop(self) -> None:
        self.process.stop()


def upstreams(plain: FakeProvider, tls: FakeProvider, extra: str = "") -> str:
    """The test config's head: both listeners on port 0, an upstream per fake provider."""
    return f"""
[server]
listen = "127.0.0.1:0"
max_request_body = "64KiB"
shutdown_grace = "2s"

[admin]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"

[upstreams.plain]
url = "{plain.url}"
connect_timeout = "2s"
cooldown = "off"

[upstreams.tls]
url = "{tls.url}"
ca_file = "{tls.ca_file}"
connect_timeout = "2s"
cooldown = "off"
{extra}
"""


# The shared instance: one route per SDK and transport, and a few routes with policies for
# particular tests. Keys are unique per test, so tests never see each other's scripts or counts.
MAIN_ROUTES = """
[[routes]]
name = "openai"
path_prefix = "/openai/"
upstream = "plain"
strip_prefix = true
retry = "llm"
idempotency = "llm"

[[routes]]
name = "openai-tls"
path_prefix = "/openai-tls/"
upstream = "tls"
strip_prefix = true
retry = "llm"
idempotency = "llm"

[[routes]]
name = "anthropic"
path_prefix = "/anthropic/"
upstream = "tls"
strip_prefix = true
retry = "anthropic"
idempotency = "llm"

[[routes]]
name = "anthropic-plain"
path_prefix = "/anthropic-plain/"
upstream = "plain"
strip_prefix = true
retry = "anthropic"
idempotency = "llm"

# 504 deadline_exceeded: two attempts of 300 ms at most, 1 s in all.
[[routes]]
name = "short"
path_prefix = "/short/"
upstream = "plain"
strip_prefix = true
retry = "short"

# Attempts of 1.5 s at most: without the SDK's timeout header, three of them per request.
[[routes]]
name = "pertry"
path_prefix = "/pertry/"
upstream = "plain"
strip_prefix = true
retry = "pertry"

[retry.llm]
max_attempts = 3
base_delay = "50ms"
max_delay = "200ms"
max_retry_after = "10s"
budget_min_per_second = 1000

[retry.anthropic]
max_attempts = 3
base_delay = "50ms"
max_delay = "200ms"
max_retry_after = "10s"
budget_min_per_second = 1000
retry_on = ["connect-failure", "refused-stream", "reset", "timeout", "429", "502", "503", "504", "529"]

[retry.short]
max_attempts = 2
base_delay = "50ms"
max_delay = "50ms"
per_try_timeout = "300ms"
deadline = "1s"
budget_min_per_second = 1000

[retry.pertry]
max_attempts = 3
base_delay = "50ms"
max_delay = "50ms"
per_try_timeout = "1500ms"
budget_min_per_second = 1000

[idempotency.llm]
header = "Idempotency-Key"
"""


CHAT = dict(model="gpt-fake", messages=[{"role": "user", "content": "Say hello"}])
MESSAGE = dict(model="claude-fake", max_tokens=64, messages=[{"role": "user", "content": "Say hello"}])


# Which fake provider each route of MAIN_ROUTES forwards to.
ROUTE_UPSTREAM = {
    "openai": "plain",
    "openai-tls": "tls",
    "anthropic": "tls",
    "anthropic-plain": "plain",
    "short": "plain",
    "pertry": "plain",
}


class Sdk:
    """One app's view for the tests that run against both SDKs: `client(prefix)` makes a client
    whose base URL is that route of rebound, `call` is the app's ordinary call."""

    def __init__(self, name: str, rebound: Rebound, fakes: dict, openai_client, anthropic_client):
        self.name = name
        self.rebound = rebound
        self.fakes = fakes
        self._make = openai_client if name == "openai" else anthropic_client
        self.module = openai if name == "openai" else anthropic
        # The route the app uses by default: the plain upstream for OpenAI, TLS for Anthropic.
        self.prefix = name

    def base_url(self, prefix: str | None = None) -> str:
        prefix = prefix or self.prefix
        return f"{self.rebound.url}/{prefix}/v1" if self.name == "openai" else f"{self.rebound.url}/{prefix}"

    def direct_client(self, provider: "FakeProvider", **kwargs):
        """A client of the fake provider itself (no rebound in between)."""
        return self._make(f"{provider.url}/v1" if self.name == "openai" else provider.url, **kwargs)

    def provider(self, prefix: str | None = None) -> "FakeProvider":
        return self.fakes[ROUTE_UPSTREAM[prefix or self.prefix]]

    def client(self, prefix: str | None = None, **kwargs):
        return self._make(self.base_url(prefix), **kwargs)

    def call(self, client, **extra):
        if self.name == "openai":
            return client.chat.completions.create(**CHAT, **extra)
        return client.messages.create(**MESSAGE, **extra)

    def raw_call(self, client, **extra):
        if self.name == "openai":
            return client.chat.completions.with_raw_response.create(**CHAT, **extra)
        return client.messages.with_raw_response.create(**MESSAGE, **extra)

    def text(self, result) -> str:
        if self.name == "openai":
            return result.choices[0].message.content
        return result.content[0].text

    @property
    def server_error(self):
        """What the SDK raises for a 503 (Anthropic has a subclass of its own)."""
        return openai.InternalServerError if self.name == "openai" else anthropic.ServiceUnavailableError
