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
    # The engines' registry (their names, for labels) is the one part of the agent it reads: pure, as it is.
    bad = [o for o in offenders(files("console/scheduler"), forbidden) if not o.endswith(": agent.engines")]
    assert bad == []


def engine_descriptions() -> set[str]:
    """The registry and each engine's description: agent.engines, agent.engines.base, agent.engines.NAME."""
    return {"agent.engines", "agent.engines.base"} | {
        f"agent.engines.{p.name}" for p in (ROOT / "agent" / "engines").iterdir() if (p / "__init__.py").exists()}


def test_the_console_imports_only_the_protocol_artifacts_and_engine_descriptions_from_the_agent():
    allowed = engine_descriptions()
    bad = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in files("console")
        for name in imports(p)
        if name.startswith("agent") and not name.startswith(("agent.protocol", "agent.artifacts"))
        and name not in allowed
    ]
    assert bad == []


def test_importing_the_engines_loads_no_engine_runtime():
    code = (
        "import sys; import agent.engines, agent.engines.base;"
        "[__import__(f'agent.engines.{n}') for n in agent.engines.ENGINES];"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'peft', 'vllm', 'pynvml',"
        " 'django', 'aiohttp', 'psutil') or m.startswith(('agent.workers', 'agent.serving', 'agent.daemon'))"
        " or m.endswith(('.server', '.launch', '.leftovers', '.tracebacks'))];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


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


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def engine_names_in(path: Path, names: tuple[str, ...]) -> list[str]:
    """Where a file's code names an engine: a string equal to its name, or an identifier or attribute that contains
    it (`vllm_python`, `runs_vllm`). Comments and docstrings are not code. A library of the same name is not the
    engine: its module bound by an import or handed in as an argument (`torch.zeros`, `def f(torch)`), a
    third-party module's path (`transformers.pytorch_utils`) and its protocol's dunders (`__torch_dispatch__`)."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    libraries = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names if alias.name.split(".")[0] in names}
    libraries |= {alias.asname or alias.name for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in names
                  for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str) and id(node) not in docs and node.value in names:
                found.append(f"{node.lineno}: {node.value!r}")
            continue
        if isinstance(node, ast.Name):
            words = [] if node.id in libraries or node.id in names else [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [] if node.arg in names else [node.arg]
        elif isinstance(node, ast.keyword):
            words = [node.arg or ""]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("agent", "console"):
            words = [node.module or "", *(a.asname or a.name for a in node.names)]
        else:
            words = []
        found += [f"{getattr(node, 'lineno', 0)}: {w}" for w in words
                  if any(n in w.lower() for n in names) and not (w.startswith("__") and w.endswith("__"))]
    return found


def test_outside_their_packages_at_most_four_files_name_an_engine():
    from agent.engines import ENGINES

    naming = {}
    for path in files("agent") + files("console"):
        rel = path.relative_to(ROOT)
        if "migrations" in rel.parts or rel.parts[:2] == ("agent", "engines"):  # migrations are history
            continue
        if found := engine_names_in(path, tuple(ENGINES)):
            naming[rel.as_posix()] = found
    print("\n".join(f"{p}: {', '.join(f[:3])}" for p, f in sorted(naming.items())))
    assert len(naming) <= 4, sorted(naming)
