"""docs/engines.md shows what the code enforces, generated from it: the engine arguments a deployment may set, what
an engine's environment holds and what one request may ask of an engine. A change to one of them without the doc
fails here, naming the text to paste."""

from __future__ import annotations

import re
from pathlib import Path

from agent.engines import ENGINES
from agent.serving.request_bounds import bounds_markdown
from agent.workers import environment

DOC = Path(__file__).resolve().parents[2] / "docs" / "engines.md"


def block(name: str) -> str:
    """The generated block `name` of docs/engines.md (between its start and end markers)."""
    found = re.search(rf"<!-- {name}:start[^\n]*-->\n(.*?)\n<!-- {name}:end -->", DOC.read_text(), re.S)
    assert found, f"docs/engines.md has no {name} block"
    return found.group(1)


def test_the_engine_arguments_table_is_the_allowlist():
    assert block("engine-args") == ENGINES["vllm"].allowlist().markdown(), \
        "paste agent.engines.ENGINES['vllm'].allowlist().markdown()"


def test_the_engine_environment_list_is_the_allowlist():
    assert block("engine-env") == environment.allowlist_markdown(), "paste environment.allowlist_markdown()"


def test_the_per_request_bounds_table_is_the_code():
    assert block("request-bounds") == bounds_markdown(), "paste agent.serving.request_bounds.bounds_markdown()"
