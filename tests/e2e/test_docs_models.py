"""The models the docs name are models the pinned SDKs know and do not call deprecated.

A reader copies the examples: one naming a model that the Anthropic SDK warns about (it prints a
deprecation warning on every call) or that the OpenAI SDK does not list makes the docs look stale.
"""

from __future__ import annotations

import re
import typing

from anthropic._data import DEPRECATED_MODELS
from anthropic.types import model_param
from openai.types import chat_model

from support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "config").rglob("*.toml"))]


def literals(alias) -> set[str]:
    out: set[str] = set()
    for arg in typing.get_args(alias):
        out |= literals(arg) if typing.get_args(arg) else ({arg} if isinstance(arg, str) else set())
    return out


def named(pattern: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for m in re.finditer(pattern, page.read_text()):
            found.setdefault(m.group(0), []).append(page.relative_to(ROOT).as_posix())
    return found


def test_claude_models_in_the_docs_are_current():
    known = literals(model_param.ModelParam)
    assert "claude-sonnet-5-5" in known or len(known) > 10, sorted(known)[:20]
    for model, where in named(r"\bclaude-[a-z0-9-]*[a-z0-9]\b").items():
        if model == "claude-fake":  # the fake provider's answer
            continue
        # A Bedrock model id (`us.anthropic.claude-haiku-4-5-20251001-v1:0`) names its version last;
        # a Vertex AI one (`claude-haiku-4-5@20251001`) is matched up to its `@`.
        model = re.sub(r"-v\d+$", "", model)
        assert model in known, f"{model} ({where}) is not a model of the pinned anthropic SDK"
        assert model not in DEPRECATED_MODELS, f"{model} ({where}) is deprecated: {DEPRECATED_MODELS[model]}"


def test_openai_models_in_the_docs_are_known():
    known = literals(chat_model.ChatModel)
    assert "gpt-4o-mini" in known, sorted(known)[:20]
    for model, where in named(r"\bgpt-[a-z0-9.-]*[a-z0-9]\b").items():
        assert model in known, f"{model} ({where}) is not a chat model of the pinned openai SDK"
