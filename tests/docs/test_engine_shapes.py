"""docs/engines.md's table of what each engine runs says what the engines' capability checks decide: each cell is
worked out from the checks (agent/engines: Engine.refusal) on sample shapes, and compared with the doc's."""

from __future__ import annotations

import re
from pathlib import Path

from agent.artifacts.capability import DEVICES, ModelShape
from agent.artifacts.dtypes import WORKER_DTYPES
from agent.artifacts.model_dir import SAFETENSORS
from agent.engines import ENGINES as CHECKS
from agent.engines import refusal, sleeps_on

DOC = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
WIDTHS = range(8, 1025, 8)


def table() -> dict[str, dict[str, str]]:
    """The table under "What each engine runs": row name -> column ("vllm on CPU") -> cell."""
    text = DOC.read_text().split("## What each engine runs", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("| ---")]
    columns = [re.sub(r"`(\w+)` on (\w+)", r"\1 on \2", c) for c in rows[0][1:]]
    return {row[0]: dict(zip(columns, row[1:], strict=True)) for row in rows[1:]}


def shape(task="causal-lm", head_dim=64, vocab=1024, tokenizer_ids=1024, model_format=SAFETENSORS) -> ModelShape:
    """A sample model in `model_format`: a Llama directory, or a GGUF file of architecture llama."""
    if model_format == SAFETENSORS:
        return ModelShape("LlamaForCausalLM", "llama", task, "float32", head_dim, vocab, tokenizer_ids)
    return ModelShape("llama", model_format, task, "Q4_0", head_dim, vocab, tokenizer_ids, format=model_format)


def cells(engine: str, device: str) -> dict[str, str]:
    """What the table should say of `engine` on `device`, from its check, on models of its format."""
    own = CHECKS[engine].model_format
    tasks = [words for task, words in (("causal-lm", "causal LMs"), ("encoder", "encoders"))
             if not refusal(engine, shape(task=task, model_format=own), device)]
    widths = [w for w in WIDTHS if not refusal(engine, shape(head_dim=w, model_format=own), device)]
    vocabulary = "any" if not refusal(engine, shape(tokenizer_ids=2048, model_format=own), device) else \
        "covers every id of tokenizer.json"
    return {
        "tasks": ", ".join(tasks),
        "head_dim": "any" if len(widths) == len(WIDTHS) else ", ".join(map(str, widths)),
        "vocabulary": vocabulary,
        "dtypes": ", ".join(WORKER_DTYPES) if own == SAFETENSORS else "as the file stores them",
        "sleep": "yes" if sleeps_on(engine, device) else "no: stopped instead",
    }


def test_the_docs_table_of_what_each_engine_runs_is_what_the_checks_decide():
    doc = table()
    columns = {f"{engine} on {'CPU' if device == 'cpu' else 'CUDA'}": (engine, device)
               for engine in CHECKS for device in DEVICES}
    assert set(next(iter(doc.values()))) == set(columns)  # every engine the registry names, on every device
    for column, (engine, device) in columns.items():
        for row, cell in cells(engine, device).items():
            assert doc[row][column] == cell, f"docs/engines.md says {doc[row][column]!r} for {row} of {column}"
