"""What one llama-server replica of a GGUF file takes, from its header alone: the tensors' bytes as stored
(quantized or not), an F16 KV cache for its context, and the server's compute buffers."""

from __future__ import annotations

from agent.artifacts.estimate import Estimate
from agent.engines.llamacpp.gguf_file import GgufFacts

MIB = 1 << 20
DEFAULT_CONTEXT = 4096  # tokens when the deployment names no seq and the file names no context length
# Its compute buffers and runtime beside the weights and the KV cache (measured with the tiny model on CPU: ~20 MiB
# of process and ~1 MiB of buffers; larger models' buffers grow with the vocabulary and the batch).
RUNTIME_BYTES = 64 * MIB


def estimate_gguf(facts: GgufFacts, seq: int | None = None, device: str = "cpu") -> Estimate:
    """The Estimate of a replica of `facts`'s file with `seq` tokens of context (else the file's own, at most
    DEFAULT_CONTEXT) on `device` ("cpu" or "cuda")."""
    context = seq or min(facts.context_length or DEFAULT_CONTEXT, DEFAULT_CONTEXT)
    kv = facts.kv_bytes_per_token() * context
    notes = [f"weights: {facts.weights_bytes:,} bytes of tensors as stored ({facts.quantization})",
             f"kv cache: F16 keys and values for {context} tokens"]
    if not kv:
        notes.append("kv cache: not sized (the header names no heads or layers)")
    total = facts.weights_bytes + kv + RUNTIME_BYTES
    return Estimate(weights_bytes=facts.weights_bytes, kv_cache_bytes=kv, activation_bytes=0, adapter_pool_bytes=0,
                    overhead_bytes=RUNTIME_BYTES, total_bytes=total, parameters=0, architecture=facts.architecture,
                    family=f"{facts.architecture}+llamacpp", dtype=facts.quantization.lower(), batch=1, seq=context,
                    device=device, notes=tuple(notes))
