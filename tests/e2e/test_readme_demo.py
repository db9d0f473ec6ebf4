"""The README's offline demo ("Try it offline"), run as a reader would run it.

The section's first ```sh block is `scripts/demo`, started here in the background; every later
```sh block runs, in order, in one bash session (the helpers the first defines are used by the
others), and its output must be the ```text block that follows it in the README, line for line.
Only what cannot repeat is masked: durations (`took 0.168354s`: the README's figure, rounded down
to whole seconds, is checked as a lower bound, so the Retry-After wait of 2 s must really be
waited), `retry-after` seconds, dead-letter ids and timestamps. The ports are free ones, replaced
in the commands and in the expected text.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

from support import ROOT, Process

README = ROOT / "README.md"
DEFAULT_PORTS = {"8080": "REBOUND_LISTEN", "9901": "REBOUND_ADMIN_LISTEN", "9000": "REBOUND_DEMO_PROVIDER"}
MARK = "@@readme-block@@"


def demo_section() -> str:
    text = README.read_text()
    m = re.search(r"^## Try it offline\n(.*?)^## ", text, re.S | re.M)
    assert m, "README.md has no '## Try it offline' section"
    return m.group(1)


def blocks(section: str) -> list[tuple[str, str | None]]:
    """(commands, the expected output or None) for each ```sh block, in order."""
    out: list[tuple[str, str | None]] = []
    for m in re.finditer(r"```(sh|text)\n(.*?)```", section, re.S):
        kind, body = m.groups()
        if kind == "sh":
            out.append((body, None))
        else:
            assert out and out[-1][1] is None, "a ```text block must follow a ```sh block"
            out[-1] = (out[-1][0], body)
    return out


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def masked(text: str) -> list[str]:
    text = re.sub(r"took \d+\.\d+s", "took <t>s", text)
    text = re.sub(r"retry-after: \d+", "retry-after: <s>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", text)
    text = re.sub(r"\b\d{13}-\d+\b", "<id>", text)
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def test_the_readme_demo_prints_what_the_readme_says(tmp_path: Path):
    section = demo_section()
    steps = blocks(section)
    assert len(steps) >= 8, f"the demo has {len(steps)} command blocks"
    start, start_expected = steps[0]
    assert start.strip() == "scripts/demo", start

    ports = {default: free_port() for default in DEFAULT_PORTS}

    def localise(text: str) -> str:
        for default, port in ports.items():
            text = text.replace(f"127.0.0.1:{default}", f"127.0.0.1:{port}")
        return text

    env = dict(os.environ)
    env.update({var: f"127.0.0.1:{ports[default]}" for default, var in DEFAULT_PORTS.items()})
    env["REBOUND_DEMO_PROFILE"] = "dev"  # the binaries scripts/test built before this suite
    demo = _start_with_env(tmp_path / "demo.log", env)
    try:
        demo.wait_for(r"^rebound is ready on ", timeout=120)
        printed = demo.text()
        for line in masked(localise(start_expected or "")):
            assert line in printed.splitlines(), f"scripts/demo did not print {line!r}:\n{printed}"

        script = "".join(f"{localise(cmds)}\necho {MARK}\n" for cmds, _ in steps[1:])
        run = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        outputs = run.stdout.split(f"{MARK}\n")
        assert len(outputs) == len(steps), f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        for (cmds, expected), got in zip(steps[1:], outputs):
            if expected is None:
                assert got.strip() == "", f"{cmds!r} printed, but the README shows nothing:\n{got}"
                continue
            want = localise(expected)
            assert masked(got) == masked(want), (
                f"the README says\n{cmds}\nprints\n{want}\nbut it printed\n{got}\nstderr:\n{run.stderr}"
            )
            for w, g in zip(re.findall(r"took (\d+)\.\d+s", want), re.findall(r"took (\d+\.\d+)s", got)):
                assert float(g) >= int(w), f"{cmds!r} took {g}s, the README says {w}.x s"
    finally:
        demo.stop()
        log = demo.text()
    assert "panicked" not in log, log


def _start_with_env(log: Path, env: dict[str, str]) -> Process:
    """scripts/demo with these variables (Process passes its own environment on)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return Process(["bash", "scripts/demo"], log, ROOT)
    finally:
        os.environ.clear()
        os.environ.update(saved)
