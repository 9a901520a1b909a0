"""Where a generation step's time goes, in this process, with no server: the worker's own loader and continuous
batcher (agent.workers.runtime, agent.workers.continuous) on the same model directory and thread count as the
served replica. Each step is timed whole, and the model's forward inside it; the rest of the step is the
engine's Python (batch bookkeeping, padding, sampling). Imports torch.
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import torch

from agent.workers import runtime
from agent.workers.generation_spec import GenerationRequest
from agent.workers.spec import WorkerSpec


def load(model_dir: Path, device: str, dtype: str, threads: int | None) -> runtime.LoadedModel:
    """The model as a worker loads it (with its thread count applied to this process)."""
    return runtime.load(WorkerSpec(0, str(model_dir), "causal-lm", device, dtype, threads=threads))


def profile(model: runtime.LoadedModel, prompts: list[list[int]], new_tokens: int) -> dict[str, float | int]:
    """Run `prompts` together (greedy, `new_tokens` each) to the end; per-step figures over the steps that
    only decoded (the first step, which prefills, is reported apart)."""
    batcher = model.batcher
    forward_seconds = [0.0]
    inner = model.model.forward

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        began = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _sync(model.device)
            forward_seconds[0] += time.perf_counter() - began

    model.model.forward = timed
    try:
        for i, ids in enumerate(prompts):
            batcher.submit(i, GenerationRequest(tuple(ids), max_new_tokens=new_tokens, temperature=0.0))
        steps: list[tuple[float, float, int]] = []  # (step s, forward s, tokens)
        began = time.perf_counter()
        while batcher.busy:
            forward_seconds[0] = 0.0
            t0 = time.perf_counter()
            out = batcher.step()
            _sync(model.device)
            steps.append((time.perf_counter() - t0, forward_seconds[0], len(out.tokens)))
        wall = time.perf_counter() - began
    finally:
        del model.model.forward  # the class's forward again
    decode = steps[1:] or steps
    step_ms = statistics.median(s for s, _, _ in decode) * 1e3
    forward_ms = statistics.median(f for _, f, _ in decode) * 1e3
    other_ms = statistics.median(s - f for s, f, _ in decode) * 1e3
    tokens = sum(t for _, _, t in steps)
    return {"rows": len(prompts), "steps": len(steps), "tokens": tokens, "wall s": wall, "tokens/s": tokens / wall,
            "first step ms": steps[0][0] * 1e3, "step ms p50": step_ms, "forward ms p50": forward_ms,
            "other ms p50": other_ms, "forward share": forward_ms / step_ms if step_ms else 0.0}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def transformers_texts(model_dir: Path, adapter_dirs: dict[str, Path], jobs: list[tuple[str | None, str]],
                       max_tokens: int, device: str = "cpu", dtype: str = "float32") -> list[str]:
    """An independent reference: each (adapter or None, prompt) continued greedily by transformers' own
    `generate` (adapters through PEFT), one at a time, on the served device and dtype, decoded as the agent
    decodes (special tokens skipped)."""
    import warnings

    import transformers
    from peft import PeftModel
    from tokenizers import Tokenizer

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations, from inside PEFT
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = []
    for adapter, prompt in jobs:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
        if adapter is not None:
            model = PeftModel.from_pretrained(model, adapter_dirs[adapter]).to(device)
        model.eval()
        ids = torch.tensor([tokenizer.encode(prompt).ids], device=device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=0)
        texts.append(tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True))
    return texts
