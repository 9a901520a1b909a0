"""No doc names a flag that does not exist: every `--flag` in README.md and docs/ is one of ModelGrid's command
lines (the agent's, manage.py's commands', the benchmarks'), an engine's flag ModelGrid passes or allows, or a flag
of another tool the docs show (listed below with the tool)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DECLARED = re.compile(r'add_argument\(\s*"(--[a-z][a-z0-9-]*)"(.*?)\)\s*$', re.S | re.M)
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")
# Flags of other tools that the docs show, by tool.
OTHERS = {
    "docker/podman build and docker compose (docs/install.md, Images and Compose)": {"--build-arg", "--target",
                                                                                  "--format", "--build"},
    "manage.py migrate (Django)": {"--noinput"},
    "curl": {"--data"},
    "manage.py check (Django)": {"--deploy", "--database"},
    "py-spy": {"--gil", "--native"},
    "perf_analyzer": {"--shape"},
    "lm_eval": {"--tasks", "--include"},
    "guidellm": {"--backend", "--data", "--constraint"},
    "vllm": {"--tokenizer", "--trust-remote-code", "--load-format"},
    "a benchmark's throwaway flag, described as one": {"--sim-loop"},
    "kubectl (docs/install.md, Helm)": {"--from-file", "--type", "--patch-file", "--field-selector"},
    "helm (docs/install.md, Helm)": {"--wait", "--set"},
    "kubernetes-validate and yamllint (make chart)": {"--strict"},
}


def ours() -> set[str]:
    """Every flag ModelGrid's own command lines declare (and --no-X for a BooleanOptionalAction), and the engines'
    flags their launchers pass or their allowlists take (in their packages, agent/engines/NAME/)."""
    found: set[str] = set()
    for path in [*ROOT.glob("agent/**/*.py"), *ROOT.glob("console/**/*.py"), *ROOT.glob("bench/**/*.py")]:
        text = path.read_text()
        for flag, rest in DECLARED.findall(text):
            found.add(flag)
            if "BooleanOptionalAction" in rest.split("add_argument(")[0]:
                found.add("--no-" + flag[2:])
        if path.parent.name == "engine_args" or path.parent.parent.name == "engines":
            found |= set(re.findall(r'"(--[a-z][a-z0-9-]*)"', text))
    return found


def test_every_flag_a_doc_names_exists():
    known = ours() | set().union(*OTHERS.values())
    unknown = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for flag in FLAG.findall(line):
                if flag not in known:
                    unknown.setdefault(flag, []).append(f"{doc.name}:{number}")
    assert not unknown, f"docs name flags nothing declares: {unknown}"


def test_the_check_knows_a_flag_that_does_not_exist():
    assert "--label" not in ours()  # the flag a doc once named for the agent
    assert {"--gpus", "--cpu-threads", "--no-cap-cpu-workers", "--strategy"} <= ours()
