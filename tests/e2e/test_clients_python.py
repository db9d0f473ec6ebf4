"""The client matrix, Python half (issue 48 item 4): the LLM client libraries apps use, each pinned in
tests/requirements.txt, through the real rebound and the fake providers (matrix.py): a plain call, a
stream, a transient fault, a persistent fault with the client's own retries on, rebound's own error, an
Idempotency-Key replay and a failover, asserting what the app sees and the provider calls counted.

| client | route | the API key in (Bearer in `authorization`) | its own retries, as configured here |
| --- | --- | --- | --- |
| langchain-openai `ChatOpenAI` | `/m-openai/` | `authorization` | `.with_retry(stop_after_attempt=3)` |
| langchain-anthropic `ChatAnthropic` | `/m-anthropic/` | `authorization` | `.with_retry(stop_after_attempt=3)` |
| LiteLLM `completion("openai/...")` | `/m-openai/` | `authorization` | `num_retries=2` |
| LiteLLM `completion("anthropic/...")` | `/m-anthropic/` | `x-api-key` | `num_retries=2` |
| LiteLLM `completion("gemini/...")` | `/m-gemini/` (`api_base` ends `/v1beta`) | `x-goog-api-key` | `num_retries=2` |
| google-genai `Client.models` | `/m-gemini/` | `x-goog-api-key` | `HttpRetryOptions(attempts=3)` |
| openai-agents `Runner` (Responses API) | `/m-openai/` | `authorization` | `ModelRetrySettings(max_retries=2)` |

On top of `x-should-retry: false` (a failure rebound gave up on), LangChain's `.with_retry`, LiteLLM's
`num_retries` and google-genai's `HttpRetryOptions` retry all the same; the Agents SDK's runner does not
(its `provider_suggested` policy vetoes), nor do the OpenAI and Anthropic SDKs under LangChain and the
Agents SDK (their own `max_retries`). A retry resends the same body with the same key, so rebound gives
it one attempt: the provider's calls add up (3 + the client's retries), they do not multiply.

Nothing here may reach the internet (only the loopback is there): every test fails if a client tried
to connect anywhere else or to resolve a name (`no_outbound`): LiteLLM's model cost map comes from
the package (`LITELLM_LOCAL_MODEL_COST_MAP`), no tiktoken encoding is downloaded (no code path here
counts tokens), the Agents SDK exports no traces.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid

# Before the clients are imported: LiteLLM reads this at import (else it fetches its cost map), the
# Agents SDK would export its traces to OpenAI.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
os.environ["LITELLM_TELEMETRY"] = "False"

# Every connection and name lookup a client attempts, other than to the loopback.
OUTBOUND: list[str] = []
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo


def _guarded_connect(sock, address):
    host = address[0] if isinstance(address, tuple) else address
    if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in _LOOPBACK:
        OUTBOUND.append(f"connect {address}")
        raise ConnectionRefusedError(f"test: no connection outside the loopback ({address})")
    return _connect(sock, address)


def _guarded_getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name is not None and name not in _LOOPBACK:
        OUTBOUND.append(f"getaddrinfo {name}")
        raise socket.gaierror(socket.EAI_NONAME, f"test: no name lookup outside the loopback ({name})")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _guarded_connect
socket.getaddrinfo = _guarded_getaddrinfo

import anthropic  # noqa: E402
import litellm  # noqa: E402
import openai  # noqa: E402
import pytest  # noqa: E402
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled  # noqa: E402
from agents.retry import ModelRetrySettings, retry_policies  # noqa: E402
from google import genai  # noqa: E402
from google.genai import errors as genai_errors  # noqa: E402
from google.genai import types as genai_types  # noqa: E402
from langchain_anthropic import ChatAnthropic  # noqa: E402
from langchain_anthropic.chat_models import AnthropicAPIError  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langchain_openai.chat_models.base import OpenAIAPIError  # noqa: E402

from matrix import (  # noqa: E402
    OVERLOADED_MESSAGE,
    OWN_ERROR_CODE,
    OWN_ERROR_MESSAGE,
    OWN_ERROR_STATUS,
    PLAIN_TEXT,
    STREAM_TEXT,
    UNAVAILABLE_MESSAGE,
    base_url,
    counts,
    credential,
    for_good,
    matrix_rebound,  # noqa: F401  (the fixture)
    overloaded,
    unavailable,
)
from support import SDK_TIMEOUT, header  # noqa: E402

set_tracing_disabled(True)
litellm.telemetry = False

# LiteLLM's types make pydantic warn about `ReadOnly` TypedDict items on first use: noise, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:Items? .*ReadOnly. qualifier:UserWarning")

PROMPT = "Say hello"
OTHER_PROMPT = "Say goodbye"
# rebound's attempts per request on a target (matrix.py's retry policy).
ATTEMPTS = 3


class Seen:
    """What the app got from a call: the text, and the response headers when the client shows them."""

    def __init__(self, text: str, headers: dict[str, str] | None):
        self.text = text
        self.headers = None if headers is None else {k.lower(): v for k, v in headers.items()}


class Client:
    """One client library as an app uses it. A subclass says how to make it, call it, stream with
    it, send a header with a call, and read the text; the scenarios are written once, below."""

    name: str
    api: str  # the matrix route's API: openai, anthropic, gemini
    credential_header: str  # the header the client sends its API key in (lower case)
    credential_prefix = ""  # `Bearer ` when the key is sent as a bearer token
    retries: int  # the client's own retries in the persistent-fault scenario, as configured there
    server_error: type[BaseException]  # what the app gets for the provider's final 503
    own_error: type[BaseException]  # what the app gets for rebound's 422
    shows_headers = True  # False: the client gives the app no response headers

    def __init__(self, url: str, key: str):
        self.url = url
        self.key = key
        self.api_key = credential(key)

    def call(self, prompt: str = PROMPT, idempotency_key: str | None = None, retrying: bool = False) -> Seen:
        raise NotImplementedError

    def stream(self) -> str:
        raise NotImplementedError

    def message(self, error: BaseException) -> str:
        """The message the app reads from the exception."""
        return str(error)

    def status(self, error: BaseException) -> int:
        return error.status_code

    # What the app reads of rebound's own error besides the message, in the client's terms (the
    # fields it parsed from the route's dialect), and what that must be.
    own_error_fields_expected: dict = {"code": OWN_ERROR_CODE, "type": "rebound_error"}

    def own_error_fields(self, error: BaseException) -> dict:
        """OpenAI's dialect, as the OpenAI SDK parses it (`e.code`, `e.type`)."""
        return {"code": error.code, "type": error.type}

    def close(self) -> None:
        pass


def _headers(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key} if idempotency_key else {}


class LangChainOpenAI(Client):
    name, api = "langchain-openai", "openai"
    credential_header, credential_prefix = "authorization", "Bearer "
    retries = 2  # .with_retry(stop_after_attempt=3): LangChain retries any exception
    # LangChain's own subclass of openai.InternalServerError for a 5xx; a 4xx is the SDK's.
    server_error, own_error = OpenAIAPIError, openai.UnprocessableEntityError

    def model(self, **kwargs) -> ChatOpenAI:
        return ChatOpenAI(
            model="gpt-fake",
            base_url=self.url,
            api_key=self.api_key,
            default_headers={"x-fake-key": self.key},
            timeout=SDK_TIMEOUT,
            include_response_headers=True,
            **kwargs,
        )

    def call(self, prompt=PROMPT, idempotency_key=None, retrying=False):
        model = self.model()
        runnable = model.with_retry(stop_after_attempt=3, wait_exponential_jitter=False) if retrying else model
        reply = runnable.invoke(prompt, extra_headers=_headers(idempotency_key))
        return Seen(reply.content, reply.response_metadata["headers"])

    def stream(self):
        return "".join(chunk.content for chunk in self.model().stream(PROMPT))


class LangChainAnthropic(Client):
    name, api = "langchain-anthropic", "anthropic"
    credential_header, credential_prefix = "authorization", "Bearer "
    retries = 2
    # LangChain's own subclass of anthropic.InternalServerError for a 5xx; a 4xx is the SDK's.
    server_error, own_error = AnthropicAPIError, anthropic.UnprocessableEntityError
    shows_headers = False  # ChatAnthropic keeps no response headers in response_metadata

    def model(self, **kwargs) -> ChatAnthropic:
        return ChatAnthropic(
            model="claude-fake",
            base_url=self.url,
            api_key=self.api_key,
            default_headers={"x-fake-key": self.key},
            max_tokens=64,
            timeout=SDK_TIMEOUT,
            **kwargs,
        )

    # Anthropic's dialect: Anthropic's error type for the status, rebound's code beside it.
    own_error_fields_expected = {"type": "invalid_request_error", "code": OWN_ERROR_CODE}

    def own_error_fields(self, error):
        return {"type": error.body["error"]["type"], "code": error.body["error"]["code"]}

    def call(self, prompt=PROMPT, idempotency_key=None, retrying=False):
        model = self.model()
        runnable = model.with_retry(stop_after_attempt=3, wait_exponential_jitter=False) if retrying else model
        reply = runnable.invoke(prompt, extra_headers=_headers(idempotency_key))
        return Seen(reply.content if isinstance(reply.content, str) else reply.text, None)

    def stream(self):
        return "".join(chunk.text for chunk in self.model().stream(PROMPT))


class LiteLLM(Client):
    """LiteLLM as a library (`litellm.completion`), on its OpenAI provider."""

    name, api, provider = "litellm-openai", "openai", "openai"
    model_name = "gpt-fake"
    credential_header, credential_prefix = "authorization", "Bearer "
    retries = 2  # num_retries=2: LiteLLM retries any openai.APIError, whatever x-should-retry says
    # LiteLLM maps a 422 to its BadRequestError (litellm.UnprocessableEntityError is never raised here).
    server_error, own_error = litellm.ServiceUnavailableError, litellm.BadRequestError

    def kwargs(self, idempotency_key: str | None) -> dict:
        return dict(
            model=f"{self.provider}/{self.model_name}",
            messages=[{"role": "user", "content": PROMPT}],
            api_base=self.url,
            api_key=self.api_key,
            extra_headers={"x-fake-key": self.key, **_headers(idempotency_key)},
            timeout=SDK_TIMEOUT,
            max_tokens=64,
        )

    def call(self, prompt=PROMPT, idempotency_key=None, retrying=False):
        kwargs = self.kwargs(idempotency_key)
        kwargs["messages"] = [{"role": "user", "content": prompt}]
        if retrying:
            kwargs["num_retries"] = 2
        response = litellm.completion(**kwargs)
        # LiteLLM keeps the provider's headers with an `llm_provider-` prefix.
        raw = response._hidden_params.get("additional_headers") or {}
        headers = {k.removeprefix("llm_provider-"): v for k, v in raw.items() if k.startswith("llm_provider-")}
        return Seen(response.choices[0].message.content, headers)

    def stream(self):
        chunks = litellm.completion(**self.kwargs(None), stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


class LiteLLMAnthropic(LiteLLM):
    """LiteLLM on its Anthropic provider (its own HTTP client, not the Anthropic SDK)."""

    name, api, provider = "litellm-anthropic", "anthropic", "anthropic"
    model_name = "claude-fake"
    credential_header, credential_prefix = "x-api-key", ""
    # LiteLLM parses no field of an Anthropic error body: the app has the body's JSON in the
    # message, and rebound's code in the response headers LiteLLM keeps.
    own_error_fields_expected = {"code": None, "x-rebound-error": OWN_ERROR_CODE}

    def own_error_fields(self, error):
        return {"code": error.code, "x-rebound-error": error.litellm_response_headers.get("x-rebound-error")}


class LiteLLMGemini(LiteLLM):
    """LiteLLM on its Gemini provider (Google AI Studio's API, its own HTTP client)."""

    name, api, provider = "litellm-gemini", "gemini", "gemini"
    model_name = "gemini-fake"
    credential_header, credential_prefix = "x-goog-api-key", ""
    shows_headers = False  # LiteLLM keeps no response headers of its Gemini provider

    def __init__(self, url: str, key: str):
        # LiteLLM appends `/models/{model}:generateContent` to `api_base`: the API version is the
        # app's to give (Gemini's own host needs it; google-genai adds it itself).
        super().__init__(f"{url}/v1beta", key)

    own_error_fields_expected = {"code": None, "x-rebound-error": OWN_ERROR_CODE}

    def own_error_fields(self, error):
        return {"code": error.code, "x-rebound-error": error.litellm_response_headers.get("x-rebound-error")}


class GoogleGenAI(Client):
    name, api = "google-genai", "gemini"
    credential_header = "x-goog-api-key"
    retries = 2  # HttpRetryOptions(attempts=3): retries 408, 429, 5xx, whatever x-should-retry says
    server_error, own_error = genai_errors.ServerError, genai_errors.ClientError

    def client(self, retrying: bool = False) -> genai.Client:
        retry = genai_types.HttpRetryOptions(attempts=3, initial_delay=0.01, max_delay=0.05) if retrying else None
        options = genai_types.HttpOptions(
            base_url=self.url,
            headers={"x-fake-key": self.key},
            timeout=int(SDK_TIMEOUT * 1000),
            retry_options=retry,
        )
        return genai.Client(api_key=self.api_key, http_options=options)

    def call(self, prompt=PROMPT, idempotency_key=None, retrying=False):
        config = genai_types.GenerateContentConfig(
            http_options=genai_types.HttpOptions(headers=_headers(idempotency_key)) if idempotency_key else None
        )
        with self.client(retrying) as client:
            response = client.models.generate_content(model="gemini-fake", contents=prompt, config=config)
            return Seen(response.text, dict(response.sdk_http_response.headers))

    def stream(self):
        with self.client() as client:
            return "".join(
                c.text or "" for c in client.models.generate_content_stream(model="gemini-fake", contents=PROMPT)
            )

    def message(self, error):
        return error.message

    def status(self, error):
        return error.code

    # Google's dialect: the status name for 422, rebound's code as an ErrorInfo reason.
    own_error_fields_expected = {"status": "INVALID_ARGUMENT", "reason": OWN_ERROR_CODE}

    def own_error_fields(self, error):
        return {"status": error.status, "reason": error.details["error"]["details"][0]["reason"]}


class OpenAIAgents(Client):
    """The OpenAI Agents SDK: an Agent on the Responses API (its default), run by the Runner."""

    name, api = "openai-agents", "openai"
    credential_header, credential_prefix = "authorization", "Bearer "
    # ModelRetrySettings(max_retries=2) with the policies its docs suggest: `provider_suggested`
    # reads `x-should-retry: false` as a veto, so the runner does not retry a failure rebound gave
    # up on (and the OpenAI client under it obeys the header too).
    retries = 0
    server_error, own_error = openai.InternalServerError, openai.UnprocessableEntityError
    shows_headers = False  # a RunResult has no response headers

    def agent(self, client: openai.AsyncOpenAI, idempotency_key: str | None, retrying: bool) -> Agent:
        retry = None
        if retrying:
            retry = ModelRetrySettings(
                max_retries=2,
                backoff={"initial_delay": 0.01, "max_delay": 0.05, "jitter": False},
                policy=retry_policies.any(
                    retry_policies.provider_suggested(),
                    retry_policies.retry_after(),
                    retry_policies.network_error(),
                    retry_policies.http_status([408, 409, 429, 500, 502, 503, 504]),
                ),
            )
        settings = ModelSettings(extra_headers=_headers(idempotency_key) or None, retry=retry)
        return Agent(
            name="matrix",
            instructions="Answer briefly.",
            model=OpenAIResponsesModel(model="gpt-fake", openai_client=client),
            model_settings=settings,
        )

    def run(self, go) -> object:
        """`go(client)` in a new event loop, with a client closed before the loop is."""

        async def main():
            async with openai.AsyncOpenAI(
                base_url=self.url, api_key=self.api_key, default_headers={"x-fake-key": self.key}, timeout=SDK_TIMEOUT
            ) as client:
                return await go(client)

        return asyncio.run(main())

    def call(self, prompt=PROMPT, idempotency_key=None, retrying=False):
        async def go(client):
            return await Runner.run(self.agent(client, idempotency_key, retrying), prompt)

        return Seen(self.run(go).final_output, None)

    def stream(self):
        async def go(client):
            result = Runner.run_streamed(self.agent(client, None, False), PROMPT)
            text = ""
            async for event in result.stream_events():
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    text += event.data.delta
            return text

        return self.run(go)


CLIENTS = [
    LangChainOpenAI,
    LangChainAnthropic,
    LiteLLM,
    LiteLLMAnthropic,
    LiteLLMGemini,
    GoogleGenAI,
    OpenAIAgents,
]

# What each API's own error body says for a scripted fault: the app's message must carry it.
PROVIDER_MESSAGE = {"unavailable": UNAVAILABLE_MESSAGE, "overloaded": OVERLOADED_MESSAGE}


@pytest.fixture(autouse=True)
def no_outbound():
    """Fails the test if a client tried to reach anything but the loopback (the first test also
    reports what the clients tried when they were imported)."""
    yield
    tried, OUTBOUND[:] = list(OUTBOUND), []
    assert tried == [], f"a client tried to reach outside the loopback: {tried}"


@pytest.fixture(scope="module", autouse=True)
def socket_guard():
    """The guard is installed when this module is imported (LiteLLM fetches at import); the
    socket functions are restored once its tests are done."""
    yield
    socket.socket.connect, socket.getaddrinfo = _connect, _getaddrinfo


@pytest.fixture(params=CLIENTS, ids=[c.name for c in CLIENTS])
def client(request, matrix_rebound, key) -> Client:  # noqa: F811
    c = request.param(base_url(matrix_rebound, request.param.api), key)
    yield c
    c.close()


def test_plain_call(client, fake, fake_tls, key):
    seen = client.call()
    assert seen.text == PLAIN_TEXT
    assert counts(fake, fake_tls, key) == (1, 0)
    if client.shows_headers:
        assert seen.headers.get("x-rebound-upstream", "").endswith("plain"), seen.headers


def test_credential_header(client, fake, key):
    """The header the client sends its API key in: the one an operator replaces with `set_headers`
    to keep the key in the sidecar."""
    client.call()
    (recorded,) = fake.requests(key)
    assert header(recorded, client.credential_header) == client.credential_prefix + client.api_key
    others = {"authorization", "x-api-key", "x-goog-api-key", "api-key"} - {client.credential_header}
    assert {h: header(recorded, h) for h in others} == {h: None for h in others}


def test_stream(client, fake, fake_tls, key):
    assert client.stream() == STREAM_TEXT
    assert counts(fake, fake_tls, key) == (1, 0)


def test_transient_fault_is_retried_by_rebound_alone(client, fake, fake_tls, key):
    """One 503, then success: rebound's second attempt answers; the client, with its defaults, sent
    one request (2 provider calls, not more)."""
    fake.script(key, [unavailable(client.api)])
    seen = client.call()
    assert seen.text == PLAIN_TEXT
    assert counts(fake, fake_tls, key) == (2, 0)
    if client.shows_headers:
        assert seen.headers.get("x-rebound-attempts") == "2", seen.headers


def test_persistent_fault_reaches_the_app(client, fake, fake_tls, key):
    """503 for good, the client's own retries on: the app gets the client's exception for a 503 with
    the provider's message. The provider is called rebound's 3 attempts for the first request and
    once for each of the client's retries (rebound gives a request that repeats one that failed for
    good moments ago a single attempt): the layers add up, they do not multiply."""
    fake.script(key, for_good(unavailable(client.api)))
    with pytest.raises(client.server_error) as raised:
        client.call(retrying=True)
    assert type(raised.value) is client.server_error
    assert client.status(raised.value) == 503
    assert UNAVAILABLE_MESSAGE in client.message(raised.value)
    # Every attempt carried the same body and credential: the client's retries repeat the request.
    sent = {(bytes(q["body"]), header(q, client.credential_header)) for q in fake.requests(key)}
    assert len(sent) == 1, sent
    assert counts(fake, fake_tls, key) == (ATTEMPTS + client.retries, 0)


def test_rebounds_own_error_in_the_routes_dialect(client, fake, fake_tls, key):
    """rebound's own error (an Idempotency-Key sent again with another body: 422
    `idempotency_key_reused`), written in the route's API's dialect: the client raises its
    exception for a 422 and the app reads rebound's message, not a bare status."""
    idem = f"idem-{uuid.uuid4().hex}"
    client.call(idempotency_key=idem)
    with pytest.raises(client.own_error) as raised:
        client.call(prompt=OTHER_PROMPT, idempotency_key=idem)
    assert type(raised.value) is client.own_error
    assert client.status(raised.value) == OWN_ERROR_STATUS
    message = client.message(raised.value)
    assert OWN_ERROR_MESSAGE in message, message
    assert client.own_error_fields(raised.value) == client.own_error_fields_expected
    assert counts(fake, fake_tls, key) == (1, 0)


def test_idempotency_key_replay(client, fake, fake_tls, key):
    idem = f"idem-{uuid.uuid4().hex}"
    first = client.call(idempotency_key=idem)
    second = client.call(idempotency_key=idem)
    assert first.text == second.text == PLAIN_TEXT
    assert counts(fake, fake_tls, key) == (1, 0)
    if client.shows_headers:
        assert first.headers.get("idempotent-replayed") is None, first.headers
        assert second.headers.get("idempotent-replayed") == "true", second.headers


def test_failover(client, fake, fake_tls, key):
    """The first target is overloaded (529): the request moves to the second at once."""
    fake.script(key, [overloaded(client.api)])
    seen = client.call()
    assert seen.text == PLAIN_TEXT
    assert counts(fake, fake_tls, key) == (1, 1)
    if client.shows_headers:
        assert seen.headers.get("x-rebound-upstream", "").endswith("tls"), seen.headers
        assert seen.headers.get("x-rebound-failovers") == "1", seen.headers
