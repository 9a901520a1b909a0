"""The dependency rules of docs/architecture.md, checked on the source."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    """Top-level module names imported anywhere in the file (module level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def offenders(paths, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}: {name}"
        for p in paths
        for name in imports(p)
        if name.split(".")[0] in forbidden or name.startswith(forbidden)
    ]


def test_the_agent_never_imports_django_or_the_console():
    assert offenders(files("agent"), ("django", "ninja", "channels", "console")) == []


def test_the_scheduler_core_is_pure():
    forbidden = ("django", "ninja", "channels", "agent", "console.fleet", "console.catalog", "console.deployments",
                 "console.control", "console.intake", "console.realtime", "console.accounts", "asyncio", "socket")
    assert offenders(files("console/scheduler"), forbidden) == []


def test_the_console_imports_only_the_protocol_and_artifacts_from_the_agent():
    bad = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in files("console")
        for name in imports(p)
        if name.startswith("agent") and not name.startswith(("agent.protocol", "agent.artifacts"))
    ]
    assert bad == []


def test_protocol_and_artifacts_import_nothing_else_from_the_project():
    for package, own in (("agent/protocol", "agent.protocol"), ("agent/artifacts", "agent.artifacts")):
        bad = [n for p in files(package) for n in imports(p)
               if n.split(".")[0] in ("agent", "console") and not n.startswith(own)]
        assert bad == [], package


def test_torch_stays_inside_the_workers():
    outside = [p for p in files("agent") if "workers" not in p.parts] + files("console")
    assert offenders(outside, ("torch", "transformers", "peft")) == []


def test_pynvml_is_imported_in_one_module_only():
    users = [p.relative_to(ROOT).as_posix() for p in files("agent") + files("console") if "pynvml" in imports(p)]
    assert users == ["agent/gpus/nvml.py"]


def test_the_daemon_and_the_console_start_without_torch():
    code = (
        "import os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'console.settings');"
        "import django; django.setup(); import console.asgi, console.urls;"
        "import agent.cli, agent.daemon, agent.workers.supervisor, agent.serving;"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'pynvml') if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_scheduler_module_imports_another_modules_private_names():
    # A name with a leading underscore is its module's own: a second user means it belongs in the open.
    bad = [
        f"{p.relative_to(ROOT)}: {node.module}.{alias.name}"
        for p in files("console/scheduler")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("console.scheduler")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert bad == []
