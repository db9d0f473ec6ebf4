"""Helpers for tests/deploy: processes, a scriptable fake upstream, Prometheus text and PromQL parsing.

Every server runs on 127.0.0.1. rebound binds port 0 and its log says which ports it got; Redis and
Prometheus get a port picked by the kernel just before they start. Each process's output goes to a
file in the test's temporary directory (printed when a test fails), and every process is stopped by
the fixture that started it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REBOUND_BIN = Path(os.environ.get("REBOUND_BIN", ROOT / "target/debug/rebound"))
DESIGN_MD = ROOT.parent / "shared" / "DESIGN.md"

START_TIMEOUT = 30.0

# Requests to our own loopback servers never go through a proxy from the environment.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def need_tool(name: str, hint: str) -> str:
    """The path of a command-line tool, or a failure that says how to get it."""
    path = shutil.which(name) or (str(ROOT / ".venv/bin" / name) if (ROOT / ".venv/bin" / name).exists() else None)
    if not path:
        raise AssertionError(f"`{name}` is not installed: {hint} (scripts/test installs it)")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 20.0):
    """One HTTP request; returns (status, headers as a lower-cased dict, body). Never raises on a status."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _opener.open(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def wait_until(what: str, check, timeout: float = START_TIMEOUT, interval: float = 0.1):
    """Polls `check` until it returns something truthy; fails with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = check()
            if v:
                return v
        except OSError as e:  # connection refused while a server starts
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


class Process:
    """A child process whose output goes to a file."""

    def __init__(self, argv: list[str], log: Path, env: dict | None = None, cwd: Path = ROOT):
        self.argv = [str(a) for a in argv]
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def assert_alive(self, what: str):
        if not self.alive():
            raise AssertionError(f"{what} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def stop(self, timeout: float = 10.0):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()


# --- Redis ------------------------------------------------------------------------------------


class Redis:
    """A throwaway redis-server on a free loopback port, nothing kept on disk."""

    def __init__(self, workdir: Path):
        binary = need_tool("redis-server", "apt-get install redis-server")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = Process(
            [binary, "--bind", "127.0.0.1", "--port", self.port, "--save", "", "--appendonly", "no",
             "--dir", workdir, "--daemonize", "no"],
            workdir / "redis.log",
        )
        try:
            wait_until(f"redis-server on port {self.port}", self.ping, timeout=10)
        except BaseException as e:
            self.process.stop()
            raise AssertionError(f"{e}\nredis-server's log:\n{self.process.tail()}") from None

    def ping(self) -> bool:
        self.process.assert_alive("redis-server")
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    def stop(self):
        self.process.stop()


# --- rebound ----------------------------------------------------------------------------------


class Rebound:
    """target/debug/rebound on a config file; its proxy and admin addresses are read from its log."""

    def __init__(self, workdir: Path, config: str, env: dict | None = None, name: str = "rebound.toml"):
        if not REBOUND_BIN.exists():
            raise AssertionError(f"{REBOUND_BIN} is missing: run `cargo build --locked --bin rebound` first")
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / name
        self.config_path.write_text(config)
        self.process = Process([REBOUND_BIN, "--config", self.config_path], workdir / "rebound.log", env=env)
        try:
            m = wait_until("rebound to log its listening addresses", self._listening)
            self.proxy = f"http://{m[0]}"
            self.admin = f"http://{m[1]}"
            self.admin_addr = m[1]
            wait_until("rebound /readyz", lambda: http("GET", self.admin + "/readyz", timeout=2)[0] == 200)
        except BaseException as e:
            self.process.stop()
            raise AssertionError(f"{e}\nrebound's log:\n{self.process.tail()}") from None

    def _listening(self):
        self.process.assert_alive("rebound")
        for line in re.sub(r"\x1b\[[0-9;]*m", "", self.process.text()).splitlines():
            if "rebound listening" in line:
                proxy = re.search(r"proxy\W+(127\.0\.0\.1:\d+)", line)
                admin = re.search(r"admin\W+(127\.0\.0\.1:\d+)", line)
                if proxy and admin:
                    return proxy.group(1), admin.group(1)
        return None

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        return http(method, self.proxy + path, body, headers)

    def metrics(self) -> str:
        status, _, body = http("GET", self.admin + "/metrics")
        assert status == 200, status
        return body.decode()

    def stop(self):
        self.process.stop()


# --- a scriptable fake upstream ---------------------------------------------------------------


class FakeUpstream:
    """A plain-HTTP upstream whose answer depends on the request path:

    - `.../ok...`: 200 JSON
    - `.../chat/completions`: 200 JSON with an OpenAI `usage` (10 prompt, 5 completion tokens)
    - `.../flaky/<id>`: 503 the first time for that path, then 200
    - `.../flaky-hint/<id>`: 503 with `retry-after-ms: 20` the first time, then 200
    - `.../fail...`: 503 always
    - `.../ratelimit...`: 429 with `retry-after: 30`
    - `.../bad...`: 400

    The `x-fake-status` request header overrides the path: a status, or `503-once` (503 the first
    time for that Idempotency-Key, then 202). Every request is recorded (method, path, headers).
    """

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                with fake.lock:
                    fake.requests.append(
                        {"method": self.command, "path": self.path,
                         "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                    )
                    seen = sum(1 for r in fake.requests if r["path"] == self.path)
                    key = self.headers.get("idempotency-key")
                    seen_key = sum(1 for r in fake.requests if key and r["headers"].get("idempotency-key") == key)
                status, headers = fake.decide(self.path, self.headers.get("x-fake-status"), seen, seen_key)
                answer = {"status": status, "path": self.path, "n": seen}
                if "/chat/completions" in self.path:
                    answer["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                payload = json.dumps(answer).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def decide(path: str, override: str | None, seen: int, seen_key: int):
        if override == "503-once":
            return (503, {}) if seen_key <= 1 else (202, {})
        if override:
            return int(override), {}
        if "/flaky-hint/" in path:
            return (503, {"retry-after-ms": "20"}) if seen <= 1 else (200, {})
        if "/flaky/" in path:
            return (503, {}) if seen <= 1 else (200, {})
        if "/fail" in path:
            return 503, {}
        if "/ratelimit" in path:
            return 429, {"retry-after": "30"}
        if "/bad" in path:
            return 400, {}
        return 200, {}

    def calls(self, predicate) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if predicate(r)]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# --- Prometheus text format and PromQL --------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s")
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)")


def exported_families(text: str) -> dict[str, str]:
    """Metric family -> type, from a /metrics page (families with at least one sample)."""
    types = dict(m.groups() for m in map(_TYPE.match, text.splitlines()) if m)
    families: dict[str, str] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        if name in types:
            families[name] = types[name]
            continue
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
                families[base] = types[base]
    return families


def family_of(name: str, families: dict[str, str]) -> str:
    """The family a series name used in PromQL belongs to (`x_bucket` -> `x` for a histogram)."""
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "offset", "inf", "nan", "atan2",
}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords,
    label names (in matchers or in by/without/on/ignoring lists), strings or durations."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if word.lower() in _KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


# Grafana's built-in and dashboard variables, as a Prometheus query can take them.
GRAFANA_VARS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


def grafana_to_promql(expr: str, variables: list[str]) -> str:
    """Replaces a dashboard's template variables so that Prometheus can run the expression:
    interval variables by a duration, label variables ($route, ...) by the regex `.*`."""
    values = {**GRAFANA_VARS, **{v: ".*" for v in variables}}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def dashboard_expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(where, expr) for every PromQL expression in a Grafana dashboard: panel targets (rows'
    nested panels included), query variables (label_values(SELECTOR, label) gives SELECTOR) and
    annotation queries."""
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((f"panel {p.get('title')!r} {t.get('refId')}", t["expr"]))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*", q)
        out.append((f"variable ${v['name']}", m.group(1) if m else q))
    for a in dashboard.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation {a.get('name')!r}", a["expr"]))
    return out


def dashboard_variables(dashboard: dict) -> list[str]:
    return [v["name"] for v in dashboard.get("templating", {}).get("list", [])]


def rule_expressions(rules_doc: dict) -> list[tuple[str, str]]:
    return [
        (f"{g['name']}/{r.get('alert') or r.get('record')}", r["expr"])
        for g in rules_doc["groups"]
        for r in g["rules"]
    ]


def documented_metrics() -> tuple[set[str], set[str] | None]:
    """(the metrics table of docs/operations.md, DESIGN.md section 4's list or None when DESIGN.md
    is absent)."""
    operations = (ROOT / "docs" / "operations.md").read_text()
    table = set(re.findall(r"^\|\s*`(rebound_[a-z0-9_]+)`", operations, re.M))
    design = None
    if DESIGN_MD.exists():
        text = DESIGN_MD.read_text()
        m = re.search(r"^## 4\. Metrics.*?$(.*?)^## ", text, re.S | re.M)
        assert m, f"{DESIGN_MD}: no section '## 4. Metrics'"
        # Parenthesised text lists label values ("(outcome: `ok`, ...)") and types: not names.
        section = re.sub(r"\([^)]*\)", "", m.group(1))
        design = {"rebound_" + n for n in re.findall(r"`([a-z0-9_]+)(?:\{[^`]*\})?`", section)}
    return table, design
