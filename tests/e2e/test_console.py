"""The operator's console (`GET /console`, issue 63) in a real browser: Debian's chromium, headless,
driven by Playwright (its Python package talks to the system browser; nothing is downloaded),
against the real binary and the fake provider.

What it checks, as the person on call would see it: without the token nothing is shown (the API
answers 401 and the page says the token was refused); with it, failures injected at the provider
appear as groups by cause with their analysis line; a group is replayed after a confirmation that
says what will be sent, and the provider receives the original requests with their
`Idempotency-Key`s; a dead letter whose body holds `<script>` is rendered as text; no request
leaves the loopback; the browser logs no error.

Screenshots of each view go to the test's temporary directory, or to docs/img when
REBOUND_CONSOLE_SCREENSHOTS=docs/img (how docs/console.md's pictures are made).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from playwright.sync_api import expect, sync_playwright

from support import ROOT, header, status

TOKEN = "console-test-token-5f1c"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
OVERLOADED = json.dumps(
    {"error": {"message": "The server is overloaded, request id req_8f3aa1c2. Try again in 2.5s.", "type": "server_error"}}
)


def config(fake) -> str:
    return f"""
[server]
listen = "127.0.0.1:0"
shutdown_grace = "2s"

[admin]
listen = "127.0.0.1:0"
token = "{TOKEN}"

[log]
format = "json"
level = "info"

[retry.quick]
max_attempts = 2
base_delay = "10ms"
max_delay = "20ms"

[circuit.quick]
consecutive_failures = 3
open_for = "1s"

[idempotency.keys]

[upstreams.plain]
url = "{fake.url}"
connect_timeout = "2s"
cooldown = "off"
circuit = "quick"

[upstreams.other]
url = "{fake.url}"
connect_timeout = "2s"
cooldown = "off"

[[routes]]
name = "other"
path_prefix = "/other/"
upstream = "other"
strip_prefix = true
retry = "quick"
idempotency = "keys"
dead_letters = true
dead_letter_bodies = true

[[routes]]
name = "chat"
path_prefix = "/openai/"
upstream = "plain"
strip_prefix = true
retry = "quick"
idempotency = "keys"
dead_letters = true
dead_letter_bodies = true
"""


def post(url: str, path: str, body: dict, headers: dict[str, str]) -> int:
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json", "authorization": "Bearer sk-test-console", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def admin_get(rebound, path: str) -> dict:
    req = urllib.request.Request(rebound.admin + path, headers={"authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def shots(tmp_path) -> Path:
    target = os.environ.get("REBOUND_CONSOLE_SCREENSHOTS")
    d = ROOT / target if target else tmp_path / "screenshots"
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_the_console_shows_groups_and_replays_one_in_a_real_browser(fake, start_rebound, key, shots):
    rebound = start_rebound(config(fake))
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    # Three requests, each answered 503 twice (both attempts): three dead letters of one cause.
    fake.script(key, [status(503, {"content-type": "application/json"}, OVERLOADED)] * 6)
    keys = [f"{key}-idem-{i}" for i in range(3)]
    for k in keys:
        assert post(rebound.url, "/openai/v1/chat/completions", chat, {"x-fake-key": key, "idempotency-key": k}) == 503
    # One whose body holds markup, refused by a provider whose message holds markup too (on an
    # upstream of its own: the first one's circuit is open by now).
    hostile = f"{key}-hostile"
    fake.script(hostile, [status(502, {"content-type": "application/json"},
                                 json.dumps({"error": {"message": "<img src=x onerror=alert(1)> bad gateway"}}))] * 2)
    evil = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "<script>alert('owned')</script>"}]}
    post(rebound.url, "/other/v1/chat/completions", evil, {"x-fake-key": hostile, "idempotency-key": f"{hostile}-1"})
    # The journal reads the series once a second: wait until it has seen the circuit open.
    deadline = time.monotonic() + 10
    while "the circuit opened" not in json.dumps(admin_get(rebound, "/admin/dead-letters/summary")):
        assert time.monotonic() < deadline, "the journal never saw the circuit open"
        time.sleep(0.2)

    # The API without the token: refused.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rebound.admin + "/admin/fleet", timeout=10)
    assert refused.value.code == 401

    requests_seen: list[str] = []
    problems: list[str] = []
    admin = urlparse(rebound.admin)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})

        def only_loopback(route):
            url = urlparse(route.request.url)
            requests_seen.append(route.request.url)
            if url.hostname == admin.hostname and url.port == admin.port:
                route.continue_()
            else:
                problems.append(f"request left the console's origin: {route.request.url}")
                route.abort()

        context.route("**/*", only_loopback)
        page = context.new_page()
        def console_message(m):
            # The wrong token's 401 below is the one failed load expected.
            if m.type in ("error", "warning") and "status of 401" not in m.text:
                problems.append(f"console {m.type}: {m.text}")

        page.on("console", console_message)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("dialog", lambda d: (problems.append(f"a script opened a dialog: {d.message}"), d.dismiss()))

        page.goto(rebound.admin + "/console")
        expect(page.locator("#login")).to_be_visible()
        expect(page.locator("#groups")).to_be_hidden()
        page.screenshot(path=str(shots / "console-sign-in.png"))

        # A wrong token: refused, nothing shown.
        page.fill("#token", "not-the-token")
        page.click("#open")
        expect(page.locator("#login-error")).to_have_text("The token was refused.")
        expect(page.locator("#groups")).to_be_hidden()

        page.fill("#token", TOKEN)
        page.click("#open")
        expect(page.locator("#groups")).to_be_visible()
        group = page.locator(".group", has_text="The server is overloaded")
        try:
            expect(group).to_have_count(1)
        except AssertionError:
            raise AssertionError(f"{page.inner_text('body')}\n{problems}")
        expect(group.locator(".count")).to_have_text("3")
        expect(group.locator(".message")).to_have_text("The server is overloaded, request id <id>. Try again in #.")
        analysis = group.locator(".analysis")
        expect(analysis).to_contain_text("3 × plain answered 503")
        expect(analysis).to_contain_text("retries exhausted")
        expect(analysis).to_contain_text("the circuit opened")
        expect(group.locator(".verdict")).to_have_text(["wait"])
        expect(page.locator(".fleet-upstream[data-upstream=plain]")).to_be_visible()
        page.screenshot(path=str(shots / "console-groups.png"), full_page=True)

        # The hostile entry: its markup is text.
        hostile_group = page.locator(".group", has_text="bad gateway")
        expect(hostile_group.locator(".message")).to_have_text("<img src=x onerror=alert(#)> bad gateway")
        hostile_group.locator("button.entries").click()
        page.locator(".entry-row button.open-entry").first.click()
        body = page.locator("#entry-body")
        expect(body).to_contain_text("<script>alert('owned')</script>")
        assert page.locator("#entry-body script, #entry-body img, #groups img").count() == 0
        assert "authorization" not in page.locator("#entry-headers").inner_text().lower()
        page.screenshot(path=str(shots / "console-entry.png"), full_page=True)
        page.click("#entry-close")
        page.click("#entries-close")

        # The provider is well again; the app's own traffic probes the circuit closed.
        fake.script(key, [])
        deadline = time.monotonic() + 10
        while post(rebound.url, "/openai/v1/chat/completions", chat, {"x-fake-key": f"{key}-probe"}) != 200:
            assert time.monotonic() < deadline, "the circuit never closed"
            time.sleep(0.2)
        # Replay the group: the confirmation says what will be sent.
        group.locator("button.replay").click()
        dialog = page.locator("#confirm")
        expect(dialog).to_be_visible()
        expect(page.locator("#confirm-text")).to_contain_text("3 request(s) will be sent, 3 with their original Idempotency-Key")
        expect(page.locator("#confirm-text")).to_contain_text("3 × POST /openai/v1/chat/completions on route chat")
        page.screenshot(path=str(shots / "console-replay.png"))
        page.click("#confirm-go")
        expect(page.locator("#result")).to_have_text("Replayed 3: 3 succeeded, 0 skipped.")
        expect(group.locator(".dim").first).to_contain_text("3 replayed")
        browser.close()

    # The provider received the original requests again, each with its original key.
    received = fake.requests(key)
    replayed = received[-3:]
    assert sorted(header(r, "idempotency-key") for r in replayed) == sorted(keys)
    assert all(r["path"] == "/v1/chat/completions" for r in replayed)
    assert not problems, problems
    assert requests_seen and all(urlparse(u).hostname == "127.0.0.1" for u in requests_seen), requests_seen
