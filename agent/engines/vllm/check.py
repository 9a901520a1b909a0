"""What vLLM can run, as far as a model's files tell (vLLM 0.32; its CPU build checked on this machine kind).

- Causal language models only: ModelGrid sends vLLM completions and chats, never its pooling runners.
- The vocabulary must cover every id the tokenizer makes: an id past the embedding kills its engine at the first
  request that has one.
- On CPU, its attention kernels take only some head widths (vllm/v1/attention/backends/cpu_attn.py,
  CPUAttentionBackend.get_supported_head_sizes). Its CPU platform picks that backend without checking the model's
  heads, so a model with others starts, reads healthy, and dies at its first request. Its CUDA backends (FlashAttention,
  Triton, FlexAttention) cover every width between them, so nothing is refused there for its heads.
- Sleep mode needs CUDA.
"""

from __future__ import annotations

from agent.artifacts.capability import Device, ModelShape

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def refusal(shape: ModelShape, device: Device) -> str:
    """Why vLLM cannot run a model of `shape` on `device`; "" when its files tell of nothing it cannot."""
    if shape.task != "causal-lm":
        kind = "an encoder" if shape.task == "encoder" else f"a {shape.architecture}"
        return f"vLLM serves causal language models here; this model is {kind}"
    if shape.tokenizer_ids and shape.vocab_size and shape.tokenizer_ids > shape.vocab_size:
        return (f"its tokenizer makes ids up to {shape.tokenizer_ids - 1}, past its vocab_size of "
                f"{shape.vocab_size}: vLLM needs the vocabulary to cover every id its tokenizer makes")
    if device == "cpu" and shape.head_dim is not None and shape.head_dim not in CPU_HEAD_SIZES:
        if shape.head_dim < CPU_HEAD_SIZES[0]:
            need = f"head_dim >= {CPU_HEAD_SIZES[0]}"
        else:
            need = f"a head_dim of {', '.join(map(str, CPU_HEAD_SIZES[:-1]))} or {CPU_HEAD_SIZES[-1]}"
        return f"vLLM's CPU attention needs {need}; this model's heads are {shape.head_dim} wide"
    return ""
