"""One model on several hosts, as the official SDKs see it: a route whose first target is the
model's own API and whose other targets are the same model on cloud hosts, each a fake provider
process emulating that host (tests/it/support/fake_hosts.rs).

- Claude: Anthropic (a fake) -> Amazon Bedrock in us-east-1 -> Bedrock in us-west-2 (SigV4 with
  rebound's AWS keys from its environment) -> Vertex AI (a bearer token set by the upstream). The
  Anthropic Python SDK, unchanged (a base URL and a dummy key), calls the route; the first host
  answers 429, and the next ones as each case says.
- GPT: OpenAI (a fake) -> Azure OpenAI (a deployment per model, `api-version`, an `api-key`).

Each case checks what the SDK got (the text, a stream's every event), `x-rebound-upstream`, and what
each host received: the path, the body (`anthropic_version`, no `model`), the credential, and that
the host took the request (`refused` is None: a bad signature or envelope would have been
refused with the host's own error, 403 or 400, before any script step).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse

import anthropic
import openai
import pytest

from support import (
    AWS_ACCESS_KEY,
    AWS_ENV,
    MESSAGE,
    ROOT,
    FakeProvider,
    Rebound,
    bedrock_error,
    delay,
    event_stream_exception,
    header,
    status,
)

# The model the app asks for, and its names on the hosts.
CLAUDE = MESSAGE["model"]
BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
GCP_PROJECT, GCP_LOCATION = "llm-project", "us-east5"
AZURE_API_VERSION = "2024-10-21"
AZURE_CHAT, AZURE_EMBEDDINGS = "gpt-4o-deployment", "embedding-deployment"

HOSTS = ["anthropic", "bedrock-east", "bedrock-west", "vertex", "openai", "azure"]

# What the fake's Anthropic stream of 5 deltas is, as the SDK's raw events.
STREAM_EVENTS = (
    ["message_start", "content_block_start"]
    + ["content_block_delta"] * 5
    + ["content_block_stop", "message_delta", "message_stop"]
)
DELTAS = [f"token{i} " for i in range(5)]
TEXT = "rebound " * 96

# Anthropic's 429, as the first host answers it.
ANTHROPIC_429 = status(
    429,
    {"content-type": "application/json", "retry-after": "30"},
    json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limited"}}),
)


def config(fakes: dict[str, FakeProvider]) -> str:
    """Both listeners on port 0, an upstream per fake host, the two routes."""
    url = {name: fakes[name].url for name in HOSTS}
    return f"""
[server]
listen = "127.0.0.1:0"
shutdown_grace = "2s"

[admin]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"

[upstreams.anthropic]
url = "{url['anthropic']}"
api = "anthropic"
connect_timeout = "2s"
cooldown = "off"

[upstreams.bedrock-east]
url = "{url['bedrock-east']}"
api = "bedrock"
auth = "aws"
aws_region = "us-east-1"
connect_timeout = "2s"
cooldown = "off"

[upstreams.bedrock-west]
url = "{url['bedrock-west']}"
api = "bedrock"
auth = "aws"
aws_region = "us-west-2"
connect_timeout = "2s"
cooldown = "off"

[upstreams.vertex]
url = "{url['vertex']}"
api = "vertex-anthropic"
gcp_project = "{GCP_PROJECT}"
gcp_location = "{GCP_LOCATION}"
set_headers = {{ authorization = "Bearer test-token" }}
connect_timeout = "2s"
cooldown = "off"

[upstreams.openai]
url = "{url['openai']}"
api = "openai"
connect_timeout = "2s"
cooldown = "off"

[upstreams.azure]
url = "{url['azure']}"
api = "azure-openai"
azure_api_version = "{AZURE_API_VERSION}"
set_headers = {{ api-key = "azure-test-key" }}
connect_timeout = "2s"
cooldown = "off"

[[routes]]
name = "claude"
path_prefix = "/claude/"
strip_prefix = true
retry = "hosts"
targets = [
  {{ upstream = "anthropic" }},
  {{ upstream = "bedrock-east", models = {{ "{CLAUDE}" = "{BEDROCK_MODEL}" }} }},
  {{ upstream = "bedrock-west", models = {{ "{CLAUDE}" = "{BEDROCK_MODEL}" }} }},
  {{ upstream = "vertex", models = {{ "{CLAUDE}" = "{VERTEX_MODEL}" }} }},
]

[[routes]]
name = "gpt"
path_prefix = "/gpt/"
strip_prefix = true
retry = "hosts"
targets = [
  {{ upstream = "openai" }},
  {{ upstream = "azure", models = {{ "gpt-fake" = "{AZURE_CHAT}", "text-embedding-fake" = "{AZURE_EMBEDDINGS}" }} }},
]

[retry.hosts]
max_attempts = 3
base_delay = "10ms"
max_delay = "50ms"
budget_min_per_second = 1000
"""


@pytest.fixture(scope="module")
def fakes(workdir, fake) -> dict[str, FakeProvider]:
    """A fake provider process per host (`fake` only checks the binaries are built): each keeps
    its own counts and records, so a test tells the hosts apart."""
    started: dict[str, FakeProvider] = {}
    try:
        for name in HOSTS:
            started[name] = FakeProvider(workdir / f"host-{name}", tls=False)
        started["bedrock-east"].aws_region("us-east-1")
        started["bedrock-west"].aws_region("us-west-2")
        yield started
    finally:
        for p in started.values():
            p.stop()


def start_hosts_rebound(workdir, fakes: dict[str, FakeProvider], name: str) -> Rebound:
    """rebound on the hosts config, with the AWS example keys in its environment. A rebound that
    refuses the config (no `api`, `models` or `aws_region` yet) fails the test with its words."""
    try:
        return Rebound(workdir / name, config(fakes), env=AWS_ENV)
    except RuntimeError as e:
        refused = str(e)
    pytest.fail(f"rebound refused the hosts config:\n{refused}", pytrace=False)


@pytest.fixture(scope="module")
def hosts_rebound(workdir, fakes):
    r = start_hosts_rebound(workdir, fakes, "rebound-hosts")
    yield r
    r.stop()


@pytest.fixture
def claude(hosts_rebound, anthropic_client) -> anthropic.Anthropic:
    """The app's Anthropic client on the Claude route (SDK defaults, a dummy key, the test's
    `x-fake-key`)."""
    return anthropic_client(f"{hosts_rebound.url}/claude")


@pytest.fixture
def gpt(hosts_rebound, openai_client) -> openai.OpenAI:
    return openai_client(f"{hosts_rebound.url}/gpt/v1")


def body(recorded: dict) -> dict:
    return json.loads(bytes(recorded["body"]))


def only(fake: FakeProvider, key: str) -> dict:
    """The one request `fake` received under `key`, which its host took."""
    seen = fake.requests(key)
    assert len(seen) == 1, [(q["path"], q["refused"]) for q in seen]
    assert seen[0]["refused"] is None, seen[0]["refused"]
    return seen[0]


def no_app_credential(recorded: dict, key: str) -> None:
    """None of the app's own credential (the SDK's dummy key) reached the host."""
    assert all(f"test-{key}" not in v for _, v in recorded["headers"]), recorded["headers"]
    assert header(recorded, "x-api-key") is None


def assert_bedrock(recorded: dict, key: str, region: str, streamed: bool, request: dict = MESSAGE) -> None:
    """What Bedrock in `region` received: InvokeModel's path, the body without `model` or
    `stream` and with Bedrock's `anthropic_version`, no Anthropic headers, a SigV4 signature by the
    example keys for `bedrock` in that region (which the fake verified: the request was taken)."""
    operation = "invoke-with-response-stream" if streamed else "invoke"
    assert recorded["path"] == f"/model/{urllib.parse.quote(BEDROCK_MODEL, safe='')}/{operation}"
    sent = body(recorded)
    assert "model" not in sent and "stream" not in sent, sent
    assert sent["anthropic_version"] == "bedrock-2023-05-31", sent
    assert sent["messages"] == request["messages"] and sent["max_tokens"] == request["max_tokens"], sent
    for name in ("anthropic-version", "anthropic-beta", "x-api-key"):
        assert header(recorded, name) is None, name
    auth = header(recorded, "authorization")
    assert re.fullmatch(
        rf"AWS4-HMAC-SHA256 Credential={AWS_ACCESS_KEY}/\d{{8}}/{region}/bedrock/aws4_request, "
        r"SignedHeaders=[a-z0-9;-]+, Signature=[0-9a-f]{64}",
        auth or "",
    ), auth
    no_app_credential(recorded, key)


def assert_vertex(recorded: dict, key: str, streamed: bool) -> None:
    """What Vertex AI received: rawPredict or streamRawPredict of the mapped model in the project and
    location, the body without `model`, with Vertex's `anthropic_version` and `stream` kept, the
    upstream's bearer token."""
    method = "streamRawPredict" if streamed else "rawPredict"
    want = (
        f"/v1/projects/{GCP_PROJECT}/locations/{GCP_LOCATION}/publishers/anthropic/models/{VERTEX_MODEL}:{method}"
    )
    # The model's `@` may come percent-encoded (the contract does not say).
    assert urllib.parse.unquote(recorded["path"]) == want, recorded["path"]
    sent = body(recorded)
    assert "model" not in sent, sent
    assert sent["anthropic_version"] == "vertex-2023-10-16", sent
    assert sent.get("stream", False) is streamed, sent
    assert sent["messages"] == MESSAGE["messages"], sent
    assert header(recorded, "authorization") == "Bearer test-token"
    no_app_credential(recorded, key)


def counts(fakes: dict[str, FakeProvider], key: str, names: list[str]) -> list[int]:
    return [fakes[n].count(key) for n in names]


CLAUDE_HOSTS = ["anthropic", "bedrock-east", "bedrock-west", "vertex"]

# Which host answers when the ones before it are throttled, and how each is throttled.
CASES = {
    "anthropic-throttled": ("bedrock-east", {"anthropic": [ANTHROPIC_429]}),
    "east-throttled-too": (
        "bedrock-west",
        {"anthropic": [ANTHROPIC_429], "bedrock-east": [bedrock_error(429, "ThrottlingException")]},
    ),
    "every-bedrock-region-throttled": (
        "vertex",
        {
            "anthropic": [ANTHROPIC_429],
            "bedrock-east": [bedrock_error(429, "ThrottlingException")],
            "bedrock-west": [bedrock_error(429, "ThrottlingException")],
        },
    ),
}


def script(fakes: dict[str, FakeProvider], key: str, steps: dict[str, list[dict]]) -> None:
    for name, s in steps.items():
        fakes[name].script(key, s)


def assert_hosts(fakes, key: str, answered: str, streamed: bool) -> None:
    """Every Claude host up to `answered` got the request once (none after it), the ones before it
    as the first target's and Bedrock's envelopes say, and `answered` as its own."""
    upto = CLAUDE_HOSTS.index(answered)
    assert counts(fakes, key, CLAUDE_HOSTS) == [1] * (upto + 1) + [0] * (len(CLAUDE_HOSTS) - upto - 1)
    first = fakes["anthropic"].requests(key)[0]
    assert first["path"] == "/v1/messages"
    assert body(first)["model"] == CLAUDE
    for name, region in (("bedrock-east", "us-east-1"), ("bedrock-west", "us-west-2")):
        if CLAUDE_HOSTS.index(name) <= upto:
            assert_bedrock(only(fakes[name], key), key, region, streamed)
    if answered == "vertex":
        assert_vertex(only(fakes["vertex"], key), key, streamed)


@pytest.mark.parametrize("case", list(CASES))
def test_a_message_is_answered_by_the_next_host(case, claude, fakes, key):
    answered, steps = CASES[case]
    script(fakes, key, steps)
    raw = claude.messages.with_raw_response.create(**MESSAGE)
    message = raw.parse()
    assert raw.headers.get("x-rebound-upstream") == answered
    assert message.content[0].text == TEXT
    assert message.usage.output_tokens == 96
    assert_hosts(fakes, key, answered, streamed=False)


@pytest.mark.parametrize("case", list(CASES))
def test_a_stream_is_answered_by_the_next_host_event_for_event(case, claude, fakes, key):
    answered, steps = CASES[case]
    script(fakes, key, steps)
    with claude.messages.stream(**MESSAGE) as stream:
        upstream = stream.response.headers.get("x-rebound-upstream")
        events = [e for e in stream if e.type in set(STREAM_EVENTS)]
        final = stream.get_final_message()
    assert upstream == answered
    assert [e.type for e in events] == STREAM_EVENTS
    assert [e.delta.text for e in events if e.type == "content_block_delta"] == DELTAS
    assert final.content[0].text == "".join(DELTAS)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 5)
    assert final.stop_reason == "end_turn"
    assert_hosts(fakes, key, answered, streamed=True)


def test_anthropic_beta_becomes_bedrocks_anthropic_beta(claude, fakes, key):
    fakes["anthropic"].script(key, [ANTHROPIC_429])
    betas = ["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"]
    raw = claude.beta.messages.with_raw_response.create(**MESSAGE, betas=betas)
    assert raw.headers.get("x-rebound-upstream") == "bedrock-east"
    assert raw.parse().content[0].text == TEXT
    assert header(fakes["anthropic"].requests(key)[0], "anthropic-beta") == ",".join(betas)
    seen = only(fakes["bedrock-east"], key)
    assert_bedrock(seen, key, "us-east-1", streamed=False)
    assert body(seen)["anthropic_beta"] == betas


CLIENTS = ROOT / "tests/clients"


def test_the_typescript_sdk_is_answered_by_the_next_hosts(hosts_rebound, fakes, key):
    """The Anthropic TypeScript SDK (tests/clients, pinned) through the same route: its message is
    answered by Bedrock in us-west-2 (Anthropic and us-east-1 throttled), its stream by Vertex AI
    (us-west-2 throttled too)."""
    node = shutil.which("node")
    if node is None or not (CLIENTS / "node_modules/@anthropic-ai/sdk").is_dir():
        pytest.fail("node and tests/clients/node_modules are needed: npm ci --prefix tests/clients (scripts/test does)")
    fakes["anthropic"].script(key, [ANTHROPIC_429, ANTHROPIC_429])
    fakes["bedrock-east"].script(key, [bedrock_error(), bedrock_error()])
    fakes["bedrock-west"].script(key, [delay(0), bedrock_error()])
    run = subprocess.run(
        [node, str(CLIENTS / "anthropic_hosts.mjs"), f"{hosts_rebound.url}/claude", key],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    message, streamed = out["message"], out["stream"]
    assert "error" not in message and "error" not in streamed, out
    assert message["upstream"] == "bedrock-west"
    assert message["text"] == TEXT
    assert message["usage"]["output_tokens"] == 96
    assert streamed["upstream"] == "vertex"
    assert streamed["events"] == STREAM_EVENTS
    assert streamed["deltas"] == DELTAS
    assert streamed["text"] == "".join(DELTAS)
    assert (streamed["usage"]["input_tokens"], streamed["usage"]["output_tokens"]) == (12, 5)
    assert streamed["stop_reason"] == "end_turn"

    assert counts(fakes, key, CLAUDE_HOSTS) == [2, 2, 2, 1]
    assert [q["path"] for q in fakes["anthropic"].requests(key)] == ["/v1/messages"] * 2
    for name, region in (("bedrock-east", "us-east-1"), ("bedrock-west", "us-west-2")):
        first, second = fakes[name].requests(key)
        for recorded, streams in ((first, False), (second, True)):
            assert recorded["refused"] is None, recorded["refused"]
            assert_bedrock(recorded, key, region, streams)
    assert_vertex(only(fakes["vertex"], key), key, streamed=True)


def test_a_bedrock_exception_mid_stream_reaches_the_sdk_as_an_error(claude, fakes, key):
    """The 3rd message of Bedrock's stream is a throttlingException: the app has had two events
    (the response is committed), so rebound ends its stream with Anthropic's `error` event
    (`rate_limit_error`), which the SDK raises while iterating: `anthropic.APIStatusError` (the
    status is the stream's 200, so not `RateLimitError`). Nothing fails over after the commit."""
    fakes["anthropic"].script(key, [ANTHROPIC_429])
    fakes["bedrock-east"].script(key, [event_stream_exception(2, "throttlingException", "Too many tokens")])
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        with claude.messages.stream(**MESSAGE) as stream:
            assert stream.response.headers.get("x-rebound-upstream") == "bedrock-east"
            for event in stream:
                seen.append(event.type)
    assert type(raised.value) is anthropic.APIStatusError
    assert raised.value.status_code == 200
    assert raised.value.body["type"] == "error", raised.value.body
    assert raised.value.body["error"]["type"] == "rate_limit_error", raised.value.body
    assert seen == ["message_start", "content_block_start"]
    assert counts(fakes, key, CLAUDE_HOSTS) == [1, 1, 0, 0]
    assert_bedrock(only(fakes["bedrock-east"], key), key, "us-east-1", streamed=True)


def test_a_bedrock_exception_as_the_first_message_fails_over(claude, fakes, key):
    """Bedrock's stream begins with a throttlingException: nothing reached the app, so rebound
    takes it as the region's 429 and the next region answers the whole stream."""
    fakes["anthropic"].script(key, [ANTHROPIC_429])
    fakes["bedrock-east"].script(key, [event_stream_exception(0, "throttlingException", "Too many tokens")])
    with claude.messages.stream(**MESSAGE) as stream:
        upstream = stream.response.headers.get("x-rebound-upstream")
        events = [e.type for e in stream if e.type in set(STREAM_EVENTS)]
        final = stream.get_final_message()
    assert upstream == "bedrock-west"
    assert events == STREAM_EVENTS
    assert final.content[0].text == "".join(DELTAS)
    assert counts(fakes, key, CLAUDE_HOSTS) == [1, 1, 1, 0]
    assert_bedrock(only(fakes["bedrock-east"], key), key, "us-east-1", streamed=True)
    assert_bedrock(only(fakes["bedrock-west"], key), key, "us-west-2", streamed=True)


CHAT = dict(model="gpt-fake", messages=[{"role": "user", "content": "Say hello"}])


def assert_azure(recorded: dict, key: str, deployment: str, operation: str) -> None:
    """What Azure OpenAI received: the deployment's path with `api-version`, the upstream's
    `api-key`, none of the app's credential."""
    assert recorded["path"] == f"/openai/deployments/{deployment}/{operation}"
    assert urllib.parse.parse_qs(recorded["query"] or "") == {"api-version": [AZURE_API_VERSION]}
    assert header(recorded, "api-key") == "azure-test-key"
    assert header(recorded, "authorization") is None
    no_app_credential(recorded, key)


def test_chat_is_answered_by_azure(gpt, fakes, key):
    fakes["openai"].script(key, [status(429)])
    raw = gpt.chat.completions.with_raw_response.create(**CHAT)
    assert raw.headers.get("x-rebound-upstream") == "azure"
    assert raw.parse().choices[0].message.content == TEXT
    assert counts(fakes, key, ["openai", "azure"]) == [1, 1]
    assert fakes["openai"].requests(key)[0]["path"] == "/v1/chat/completions"
    assert_azure(only(fakes["azure"], key), key, AZURE_CHAT, "chat/completions")


def test_a_streamed_chat_is_answered_by_azure(gpt, fakes, key):
    fakes["openai"].script(key, [status(429)])
    raw = gpt.chat.completions.with_raw_response.create(
        **CHAT, stream=True, stream_options={"include_usage": True}
    )
    assert raw.headers.get("x-rebound-upstream") == "azure"
    chunks = list(raw.parse())
    assert "".join(c.choices[0].delta.content for c in chunks if c.choices) == "".join(DELTAS)
    assert chunks[-1].usage.completion_tokens == 5
    seen = only(fakes["azure"], key)
    assert_azure(seen, key, AZURE_CHAT, "chat/completions")
    assert body(seen)["stream"] is True


def test_embeddings_are_answered_by_azure(gpt, fakes, key):
    fakes["openai"].script(key, [status(429)])
    raw = gpt.embeddings.with_raw_response.create(model="text-embedding-fake", input=["a", "b"])
    assert raw.headers.get("x-rebound-upstream") == "azure"
    data = raw.parse().data
    # The fake's vector of input i is (8i .. 8i+7) / 64, sent as base64 as the SDK asks.
    assert [d.embedding for d in data] == [[(8 * i + d) / 64 for d in range(8)] for i in range(2)]
    seen = only(fakes["azure"], key)
    assert_azure(seen, key, AZURE_EMBEDDINGS, "embeddings")
    assert body(seen)["input"] == ["a", "b"]


def token_series(page: str) -> list[dict]:
    """Every `rebound_tokens_total` sample of a Prometheus page: its labels and value."""
    out = []
    for m in re.finditer(r"^rebound_tokens_total\{([^}]*)\} (\S+)$", page, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out.append({**labels, "value": float(m.group(2))})
    return out


def delivered(page: str, route: str, upstream: str, kind: str) -> float:
    return sum(
        s["value"]
        for s in token_series(page)
        if (s["route"], s["upstream"], s["kind"], s["outcome"]) == (route, upstream, kind, "delivered")
    )


def test_every_host_counts_the_tokens_it_delivered(workdir, fakes, anthropic_client, openai_client, key):
    """A rebound of its own: a message and a stream answered by each Claude host, a chat and an
    embedding by each GPT host; `rebound_tokens_total` then has delivered input and output tokens
    for every upstream (the model label is `other`: no `[metrics] models`)."""
    r = start_hosts_rebound(workdir, fakes, f"rebound-tokens-{key}")
    try:
        claude = anthropic_client(f"{r.url}/claude")
        gpt = openai_client(f"{r.url}/gpt/v1")
        throttled = [ANTHROPIC_429, bedrock_error(), bedrock_error()]
        for depth, name in enumerate(CLAUDE_HOSTS):
            for streamed in (False, True):
                for host, step in zip(CLAUDE_HOSTS[:depth], throttled):
                    fakes[host].script(key, [step])
                if streamed:
                    with claude.messages.stream(**MESSAGE) as stream:
                        assert stream.response.headers.get("x-rebound-upstream") == name
                        stream.get_final_message()
                else:
                    raw = claude.messages.with_raw_response.create(**MESSAGE)
                    assert raw.headers.get("x-rebound-upstream") == name
        for depth, name in enumerate(["openai", "azure"]):
            if depth:
                fakes["openai"].script(key, [status(429), status(429)])
            raw = gpt.chat.completions.with_raw_response.create(**CHAT)
            assert raw.headers.get("x-rebound-upstream") == name
            raw = gpt.embeddings.with_raw_response.create(model="text-embedding-fake", input="a")
            assert raw.headers.get("x-rebound-upstream") == name
        # A message (12 in, 96 out) and a stream (12 in, 5 out) per Claude host; a chat (12 in, 96
        # out) and an embedding (8 in) per GPT host.
        want = {("claude", name, "input"): 24 for name in CLAUDE_HOSTS}
        want |= {("claude", name, "output"): 101 for name in CLAUDE_HOSTS}
        want |= {("gpt", name, "input"): 20 for name in ("openai", "azure")}
        want |= {("gpt", name, "output"): 96 for name in ("openai", "azure")}
        # A stream's tokens are counted when rebound's body ends, just after the SDK's last read.
        deadline = time.monotonic() + 10
        while True:
            page = r.metrics()
            got = {k: delivered(page, *k) for k in want}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert got == want, token_series(page)
    finally:
        r.stop()
