"""The offline demo, run as a reader would run it: the README's "Try it offline" section, and
docs/demo.md, the whole walk-through that section is the start of.

Each is run on a demo of its own. Its first ```sh block is `scripts/demo`, started here in the
background; every later ```sh block runs, in order, in one bash session (the helpers the second
defines are used by the others), and its output must be the ```text block that follows it on the
page, line for line. Only what cannot repeat is masked: durations (`took 0.168354s`: the page's
figure, rounded down to whole seconds, is checked as a lower bound, so the Retry-After wait of 2 s
must really be waited), `retry-after` seconds, dead-letter ids and timestamps. The ports are free
ones, replaced in the commands and in the expected text.

The README's blocks are the first blocks of docs/demo.md, word for word (checked without running
anything), so that a reader who ran the README's can go on with the page in the same terminals.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

from support import ROOT, Process

README = ROOT / "README.md"
DEMO = ROOT / "docs" / "demo.md"
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
    text = re.sub(r"\b\d\d:\d\d:\d\d\b", "<hms>", text)  # the journal's event times
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def run_demo(page: str, steps: list[tuple[str, str | None]], tmp_path: Path) -> None:
    """Starts scripts/demo as `steps[0]` says, runs the other steps in one bash session, and
    checks that each prints what `page` shows after it."""
    start, start_expected = steps[0]
    assert start.strip() == "scripts/demo", f"{page}: the first block is not scripts/demo: {start!r}"

    ports = {default: free_port() for default in DEFAULT_PORTS}

    def localise(text: str) -> str:
        for default, port in ports.items():
            text = text.replace(f"127.0.0.1:{default}", f"127.0.0.1:{port}")
        return text

    env = {var: f"127.0.0.1:{ports[default]}" for default, var in DEFAULT_PORTS.items()}
    env["REBOUND_DEMO_PROFILE"] = "dev"  # the binaries scripts/test built before this suite
    demo = Process(["bash", "scripts/demo"], tmp_path / "demo.log", ROOT, env)
    try:
        demo.wait_for(r"^rebound is ready on ", timeout=120)
        printed = demo.text()
        for line in masked(localise(start_expected or "")):
            assert line in printed.splitlines(), f"scripts/demo did not print {line!r}:\n{printed}"

        script = "".join(f"{localise(cmds)}\necho {MARK}\n" for cmds, _ in steps[1:])
        run = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
        )
        outputs = run.stdout.split(f"{MARK}\n")
        assert len(outputs) == len(steps), f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        for (cmds, expected), got in zip(steps[1:], outputs):
            if expected is None:
                assert got.strip() == "", f"{cmds!r} printed, but {page} shows nothing:\n{got}"
                continue
            want = localise(expected)
            assert masked(got) == masked(want), (
                f"{page} says\n{cmds}\nprints\n{want}\nbut it printed\n{got}\nstderr:\n{run.stderr}"
            )
            for w, g in zip(re.findall(r"took (\d+)\.\d+s", want), re.findall(r"took (\d+\.\d+)s", got)):
                assert float(g) >= int(w), f"{cmds!r} took {g}s, {page} says {w}.x s"
    finally:
        demo.stop()
        log = demo.text()
    assert "panicked" not in log, log


def test_the_readme_demo_prints_what_the_readme_says(tmp_path: Path):
    steps = blocks(demo_section())
    assert len(steps) >= 3, f"the README's demo has {len(steps)} command blocks: the start, the helpers, a step"
    run_demo("README.md", steps, tmp_path)


def test_the_demo_walk_through_prints_what_docs_demo_md_says(tmp_path: Path):
    steps = blocks(DEMO.read_text())
    assert len(steps) >= 8, f"docs/demo.md has {len(steps)} command blocks"
    run_demo("docs/demo.md", steps, tmp_path)


def test_the_readme_demo_is_the_start_of_docs_demo_md():
    readme, walk = blocks(demo_section()), blocks(DEMO.read_text())
    assert walk[: len(readme)] == readme, (
        "the README's demo blocks must be docs/demo.md's first blocks, word for word: a reader goes "
        f"on from one to the other in the same terminals\nREADME: {readme}\ndocs/demo.md: {walk[: len(readme)]}"
    )
