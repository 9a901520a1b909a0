"""Every benchmark stands on bench/harness.py: its command line, the header above the tables, its percentiles,
its table printer and its running stack are the only ones, so two tables that say "p99" mean the same thing, look
alike and name the machine that made them. Read from the source, not run."""

import ast
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
HARNESS = BENCH / "harness.py"
FILES = sorted(p for p in BENCH.glob("*.py") if p != HARNESS)
# Helpers that only the harness may define: a second copy drifts (one of three percentiles rounded differently).
OWN_HELPER = re.compile(r"percentile|quantile|^_?p$|print_table|^_cell$|^python_speed$|^running_stack$")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _is_entry_point(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def _imports_harness(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "bench.harness":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "bench" and any(a.name == "harness" for a in node.names):
            return True
    return False


def _strings(tree: ast.Module):
    """Every literal piece of text, f-strings' fixed parts included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_the_bench_folder_has_entry_points_to_check():
    assert len([p for p in FILES if _is_entry_point(_tree(p))]) >= 15


@pytest.mark.parametrize("path", [p for p in FILES if _is_entry_point(_tree(p))], ids=lambda p: p.name)
def test_every_benchmark_imports_the_harness(path):
    assert _imports_harness(_tree(path)), f"{path.name} runs alone but does not use bench/harness.py"


def _calls(tree: ast.Module) -> set[str]:
    return {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


@pytest.mark.parametrize("path", [p for p in FILES if _is_entry_point(_tree(p))], ids=lambda p: p.name)
def test_every_benchmark_takes_its_command_line_from_the_harness(path):
    # The harness's parser: --help works everywhere (it does not start the run) and --quick means one thing.
    assert "command_line" in _calls(_tree(path)), f"{path.name} builds its own argument parser"
    assert "ArgumentParser" not in path.read_text()


@pytest.mark.parametrize("path", [p for p in FILES if _is_entry_point(_tree(p)) and "print_table" in _calls(_tree(p))],
                         ids=lambda p: p.name)
def test_every_table_has_the_machine_header_above_it(path):
    assert "print_header" in _calls(_tree(path)), f"{path.name} prints tables without the command and machine"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_benchmark_defines_its_own_percentile_or_table_printer(path):
    tree = _tree(path)
    own = [node.name for node in ast.walk(tree)
           if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and OWN_HELPER.search(node.name)]
    assert not own, f"{path.name} defines {own}: use bench/harness.py's"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_benchmark_lays_out_a_table_by_hand(path):
    tree = _tree(path)
    by_hand = [s for s in _strings(tree) if s.lstrip("\n").startswith("|") or "---:" in s or "|---" in s]
    aligned = [ast.unparse(node) for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr in ("rjust", "ljust")]
    assert not by_hand and not aligned, f"{path.name} prints table rows itself: {(by_hand + aligned)[:3]}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_benchmark_starts_a_stack_by_hand(path):
    started = [node.lineno for node in ast.walk(_tree(path))
               if isinstance(node, ast.ImportFrom) and node.module == "tests.e2e.stack"
               and any(a.name == "start" for a in node.names)]
    assert not started, f"{path.name} imports tests.e2e.stack.start: use bench.harness.running_stack"


def test_the_table_is_markdown_with_a_hyphen_in_every_delimiter_cell(capsys):
    from bench.harness import print_table

    print_table("t", [("a", 1, float("nan"))], columns=("#", "unplaced", "unplaced"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == ["## t", "", "|  # | unplaced | unplaced |",
                         "| -: | -------: | -------: |",
                         "|  a |        1 |        - |"]


def test_the_percentile_is_a_value_some_request_had():
    from bench.harness import percentile

    values = [float(v) for v in range(1, 17)]  # 16, as estimate_accuracy's models
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 1.0)) == (8.0, 16.0, 16.0)
    assert percentile(values, 0.0) == 1.0
