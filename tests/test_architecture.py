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


# console's layers, lowest first (docs/architecture.md, "Layers"): a module imports from its own layer and those
# below. The ground floor is every module directly under console/ not named here, the package itself and the pure
# scheduler; management commands are entry points, on top with the project's wiring.
DOMAIN_APPS = ("accounts", "catalog", "deployments", "fleet", "routes", "usage", "events", "series", "alerts")
PLANE = ("intake", "control", "realtime", "gateway")
TOP = ("api", "urls", "asgi", "settings")
GROUND_PACKAGES = ("scheduler",)
MAX_UPWARD = 8


def console_modules() -> dict[str, Path]:
    found = {}
    for p in files("console"):
        if "migrations" in p.parts:
            continue
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return found


def console_imports(module: str, path: Path, known) -> list[tuple[str, int]]:
    """The console modules `module` imports anywhere in it (module level or inside functions), with the line; `from
    package import submodule` names the submodule."""
    def known_part(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:len(module.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*package, base] if base else package)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in dict.fromkeys(names):
            target = known_part(name)
            if target is not None and target != module:
                found.append((target, node.lineno))
    return found


def app_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "console"


def layer_of(module: str) -> int:
    if "management" in module.split("."):
        return 3
    app = app_of(module)
    return 3 if app in TOP else 2 if app in PLANE else 1 if app in DOMAIN_APPS else 0


def upward_imports() -> list[str]:
    known = console_modules()
    return [f"{path.relative_to(ROOT)}:{line} {module} -> {target}"
            for module, path in known.items() for target, line in console_imports(module, path, known)
            if layer_of(module) < layer_of(target)]


def cycles_across_apps() -> list[list[str]]:
    """The strongly connected components of console's module import graph (every import counted) that hold modules
    of more than one app (each top-level module being an app of its own)."""
    known = console_modules()
    graph = {m: {t for t, _ in console_imports(m, p, known)} for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(m: str) -> None:  # Tarjan's algorithm
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for t in sorted(graph[m]):
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in on_stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            component = []
            while not component or component[-1] != m:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len({app_of(c) for c in component}) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def test_every_console_package_has_a_layer():
    packages = {p.parent.name for p in (ROOT / "console").glob("*/__init__.py")}
    assert packages - set(DOMAIN_APPS + PLANE + TOP + GROUND_PACKAGES) == set()


def test_at_most_8_imports_run_up_from_a_lower_layer():
    up = upward_imports()
    print(f"\n{len(up)} upward imports in console/:", *up, sep="\n  ")
    assert len(up) <= MAX_UPWARD, "\n".join(up)


def test_no_import_cycle_spans_two_apps():
    cycles = cycles_across_apps()
    for component in cycles:
        apps = sorted({app_of(m) for m in component})
        print(f"\ncycle of {len(component)} modules over {', '.join(apps)}:", *component, sep="\n  ")
    assert cycles == []


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
