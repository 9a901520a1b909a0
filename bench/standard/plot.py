"""The standard shapes' figure: TTFT p50 and output tokens/s per shape, a bar per target. Run with the bench
environment's Python (matplotlib lives there): `.venv-bench/bin/python bench/standard/plot.py RESULTS.json OUT.png`."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (figure, title, log scale); a shape of one request (the cold start) has no throughput to show
PANELS = (("ttft_p50_ms", "TTFT p50 (ms, log)", True), ("output_tokens_per_s", "output tokens/s", False))


def plot(data: dict, out: str) -> None:
    rows = [r for r in data["results"] if r.get("requests")]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    targets = list(dict.fromkeys(r["target"] for r in rows))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 4.5))
    width = 0.8 / max(len(targets), 1)
    for ax, (key, title, log) in zip(axes, PANELS, strict=True):
        for t, target in enumerate(targets):
            by = {r["shape"]: r.get(key) for r in rows if r["target"] == target}
            xs = [i + t * width for i, s in enumerate(shapes) if by.get(s)]
            ax.bar(xs, [by[s] for s in shapes if by.get(s)], width, label=target)
        ax.set_xticks([i + width * (len(targets) - 1) / 2 for i in range(len(shapes))], shapes, rotation=20,
                      ha="right", fontsize=8)
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Standard shapes, {data['seconds']:.0f} s each (tiny random-weight Llama on CPU)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        plot(json.load(f), sys.argv[2])
