"""One owner of a pass's state: run.Run changes it; the other modules decide and call Run's methods."""

import ast
from pathlib import Path

SCHEDULER = Path(__file__).resolve().parents[3] / "console" / "scheduler"
# run.py owns the pass's state; units.py builds the units and ledger.py keeps the reservations it is made of.
OWNERS = {"run.py", "units.py", "ledger.py"}


def _field_of_another(target: ast.expr) -> bool:
    """Whether `target` is a field of an object other than `self` (`run.x`, `u.state`, `run.ram[h]`), not a name or
    an item of a local collection."""
    fields = False
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        fields |= isinstance(target, ast.Attribute)
        target = target.value
    return fields and not (isinstance(target, ast.Name) and target.id == "self")


def _written(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        found = []
        for t in targets:
            found += t.elts if isinstance(t, ast.Tuple) else [t]
        return found
    return []


def test_only_run_and_the_modules_it_is_made_of_write_another_objects_fields():
    bad = []
    for path in sorted(SCHEDULER.glob("*.py")):
        if path.name in OWNERS:
            continue
        functions = [f for f in ast.walk(ast.parse(path.read_text())) if isinstance(f, ast.FunctionDef)]
        for node in (n for f in functions for n in ast.walk(f)):
            for target in _written(node):
                if _field_of_another(target):
                    bad.append(f"{path.name}:{node.lineno}: {ast.unparse(target)}")
    assert bad == []


def test_no_module_calls_a_private_method_of_the_run():
    bad = [f"{path.name}:{node.lineno}: run.{node.attr}"
           for path in sorted(SCHEDULER.glob("*.py"))
           for node in ast.walk(ast.parse(path.read_text()))
           if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
           and isinstance(node.value, ast.Name) and node.value.id == "run"]
    assert bad == []
