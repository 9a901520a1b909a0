"""What llama.cpp's server can run, as far as a model's shape tells (gguf_file.file_refusal judges what only the
file tells: adapters, projectors, split parts, a missing vocabulary).

- GGUF files only: a directory of safetensors is another engine's, or converts with llama.cpp's converter.
- Text generation only: ModelGrid sends it completions and chats, never embeddings or reranking.
- Architectures that its gguf (pinned with the llama.cpp it builds) names: the server knows the same list.
"""

from __future__ import annotations

from agent.artifacts.capability import ModelShape
from agent.engines.llamacpp.gguf_file import GGUF


def refusal(shape: ModelShape) -> str:
    """Why llama-server cannot run a model of `shape`, in words a person can act on; "" when it can."""
    import gguf

    if shape.model_type != GGUF:
        return (f"llama.cpp runs GGUF files; this model is a {shape.model_type or shape.architecture} directory: "
                "convert it with llama.cpp's convert_hf_to_gguf.py, or deploy it with another engine")
    if shape.architecture not in gguf.MODEL_ARCH_NAMES.values():
        return f"its architecture {shape.architecture!r} is not one this build of llama.cpp knows"
    if shape.task != "causal-lm":
        kind = "an encoder" if shape.task == "encoder" else f"a {shape.architecture} file"
        return f"llama.cpp serves text generation here; this model is {kind}"
    return ""
