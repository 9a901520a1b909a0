"""Render the Helm chart offline for each value set in deploy/helm/values/ and check what comes out.

    python deploy/helm/render.py [--out DIR]      # `make chart`

Rendering is real Helm (Helm 4's own code through helm-python-sdk, no cluster: `lookup` finds nothing). Then:
helm lint (strict); kubernetes-validate --strict against KUBERNETES_VERSION on every rendered object;
check-jsonschema of each value set, merged with the chart's defaults as Helm merges them, against
values.schema.json (and of the schema against its metaschema); yamllint on the chart's own YAML and the value
sets. Prints one table; exits 1 if any check failed. tests/deploy/test_chart.py runs the same checks.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import helm_python as helm
import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "modelgrid"
VALUE_SETS = HERE / "values"
YAMLLINT_CONFIG = HERE / ".yamllint"
KUBERNETES_VERSION = "1.34.0"  # the oldest the chart supports (Chart.yaml kubeVersion): native preStop sleep
RELEASE, NAMESPACE = "modelgrid", "modelgrid"
TOOLS = Path(sys.executable).parent


def value_sets() -> dict[str, Path]:
    """Each worked value set by its name (the file's stem)."""
    return {p.stem: p for p in sorted(VALUE_SETS.glob("*.yaml"))}


def load_values(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict, *, name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    """{template path: rendered text} as `helm template` would print it (NOTES.txt included)."""
    return helm.Chart.load(CHART).render(values=values, name=name, namespace=namespace, is_install=True)


def objects(rendered: dict[str, str]) -> list[dict]:
    """The Kubernetes objects in a rendering (templates that rendered nothing are left out)."""
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def write(rendered: dict[str, str], directory: Path) -> list[Path]:
    """The manifests written to `directory`, one file per template that rendered something."""
    written = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml") and any(yaml.safe_load_all(text)):
            target = directory / Path(path).name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            written.append(target)
    return written


@dataclass
class Result:
    check: str
    subject: str
    ok: bool
    detail: str = ""


def _run(check: str, subject: str, *cmd: str | Path) -> Result:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
    return Result(check, subject, done.returncode == 0, (done.stdout + done.stderr).strip())


def kubernetes_validate(subject: str, files: list[Path]) -> Result:
    """Every object in `files` against the Kubernetes API's schema, unknown fields refused."""
    return _run(f"kubernetes-validate --strict {KUBERNETES_VERSION}", subject, TOOLS / "kubernetes-validate",
                "--strict", "--quiet", "-k", KUBERNETES_VERSION, *files)


def check_all(out: Path) -> list[Result]:
    """Render every value set into `out` and run every check; one Result per check and subject."""
    results = []
    chart = helm.Chart.load(CHART)
    manifests, merged = [], []
    for name, path in value_sets().items():
        values = load_values(path)
        report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
        problems = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        results.append(Result("helm lint --strict", name, not problems, "\n".join(problems)))
        rendered = render(values)
        files = write(rendered, out / name)
        manifests += files
        results.append(Result("rendered objects", name, True, str(len(objects(rendered)))))
        merged_path = out / f"{name}.values.yaml"  # what Helm validates: the defaults merged with the set
        merged_path.write_text(yaml.safe_dump(chart.merge_values(values)))
        merged.append(merged_path)
        results.append(kubernetes_validate(name, files))
        results.append(_run("check-jsonschema", name, TOOLS / "check-jsonschema", "--schemafile",
                            CHART / "values.schema.json", merged_path))
    results.append(_run("check-jsonschema --check-metaschema", "values.schema.json", TOOLS / "check-jsonschema",
                        "--check-metaschema", CHART / "values.schema.json"))
    own_yaml = [CHART / "Chart.yaml", CHART / "values.yaml", *value_sets().values()]
    results.append(_run("yamllint --strict", "chart and value sets", TOOLS / "yamllint", "--strict", "-c",
                        YAMLLINT_CONFIG, *own_yaml))
    return results


def table(results: list[Result]) -> str:
    """Checks as rows, subjects as columns: ok, FAILED, or a count."""
    subjects = list(dict.fromkeys(r.subject for r in results))
    checks = list(dict.fromkeys(r.check for r in results))
    cell = {(r.check, r.subject): (r.detail if r.check == "rendered objects" else "ok" if r.ok else "FAILED")
            for r in results}
    rows = [["check", *subjects]] + [[c, *(cell.get((c, s), "") for s in subjects)] for c in checks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the manifests here (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="modelgrid-chart-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        results = check_all(out)
    print(table(results))
    for r in results:
        if not r.ok:
            print(f"\n{r.check} ({r.subject}) failed:\n{r.detail}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
