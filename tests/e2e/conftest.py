"""Fixtures for the end-to-end tests: the real OpenAI and Anthropic SDKs, rebound and the fake provider.

Every process runs on 127.0.0.1 on a port picked by the kernel (port 0), its output goes to a file
under the test's temporary directory, and a finalizer stops it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import anthropic
import openai
import pytest

from support import FAKE_BIN, MAIN_ROUTES, REBOUND_BIN, SDK_TIMEOUT, FakeProvider, Rebound, Sdk, upstreams


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def fake(workdir):
    """The plain-HTTP fake provider."""
    for b in (REBOUND_BIN, FAKE_BIN):
        if not b.exists():
            pytest.fail(f"{b} is missing: run `cargo build --bin rebound --example fake-provider` first")
    p = FakeProvider(workdir / "fake-plain", tls=False)
    yield p
    p.stop()


@pytest.fixture(scope="session")
def fake_tls(workdir):
    """The TLS fake provider (its CA is the upstream's `ca_file`)."""
    p = FakeProvider(workdir / "fake-tls", tls=True)
    yield p
    p.stop()


@pytest.fixture(scope="session")
def rebound(workdir, fake, fake_tls):
    r = Rebound(workdir / "rebound-main", upstreams(fake, fake_tls) + MAIN_ROUTES)
    yield r
    r.stop()


@pytest.fixture
def start_rebound(tmp_path):
    """Starts a rebound of its own with the given config (stopped at the end of the test)."""
    started: list[Rebound] = []

    def start(config: str) -> Rebound:
        r = Rebound(tmp_path / f"rebound-{len(started)}", config)
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


@pytest.fixture
def key(request) -> str:
    """A fake-provider key (the `x-fake-key` header) unique to this test."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:80]
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clients():
    """Closes the SDK clients a test made."""
    made: list = []
    yield made
    for c in made:
        c.close()


@pytest.fixture
def openai_client(clients, key):
    """An OpenAI client for `base_url`, as an app would make it: a dummy key, SDK defaults
    (max_retries=2) unless overridden, plus the test's `x-fake-key`."""

    def make(base_url: str, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("timeout", SDK_TIMEOUT)
        headers = {"x-fake-key": key, **kwargs.pop("default_headers", {})}
        c = openai.OpenAI(base_url=base_url, api_key=f"sk-test-{key}", default_headers=headers, **kwargs)
        clients.append(c)
        return c

    return make


@pytest.fixture
def anthropic_client(clients, key):
    def make(base_url: str, **kwargs) -> anthropic.Anthropic:
        kwargs.setdefault("timeout", SDK_TIMEOUT)
        headers = {"x-fake-key": key, **kwargs.pop("default_headers", {})}
        c = anthropic.Anthropic(base_url=base_url, api_key=f"sk-ant-test-{key}", default_headers=headers, **kwargs)
        clients.append(c)
        return c

    return make


@pytest.fixture(params=["openai", "anthropic"])
def sdk(request, rebound, fake, fake_tls, openai_client, anthropic_client) -> Sdk:
    """The test runs once per SDK."""
    return Sdk(request.param, rebound, {"plain": fake, "tls": fake_tls}, openai_client, anthropic_client)
