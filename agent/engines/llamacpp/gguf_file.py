"""A GGUF file's facts, read from its header alone (torch-free, no weights read): what it is, its sizes and its
quantization, and why llama.cpp's server cannot run it where the file itself says so.

gguf (the package) maps the file and parses its metadata and tensor table; the tensor data is never touched. It is
pinned beside xllamacpp, so the architectures and tensor types it knows are those of the server's llama.cpp.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agent.artifacts.capability import ModelShape
from agent.artifacts.errors import ArtifactError
from agent.artifacts.model_dir import ModelArtifact

# The format (Engine.model_format) and the model_type of a GGUF file: it has no config.json.
GGUF = "gguf"
MAGIC = b"GGUF"
# Architectures that embed or encode rather than generate, and files that are only part of a model.
ENCODERS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert",
                      "neo-bert", "eurobert", "t5encoder", "gemma-embedding", "llama-embed"})
NOT_TEXT = frozenset({"clip", "wavtokenizer-dec", "t5"})  # a vision/audio projector, a vocoder, an encoder-decoder


@dataclass(frozen=True)
class GgufFacts:
    """What the header of one GGUF file says."""

    path: str
    file_bytes: int
    architecture: str
    kind: str  # general.type: "model", or "adapter", "mmproj", ...
    name: str
    quantization: str  # the type most of its weight bytes are stored in ("Q8_0", "F16", "Q4_K", ...)
    tensor_types: dict[str, int] = field(default_factory=dict)  # type name -> tensors stored in it
    weights_bytes: int = 0  # every tensor's data
    parameters: int = 0  # every tensor's elements
    context_length: int | None = None
    embedding_length: int | None = None
    block_count: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None
    key_length: int | None = None
    value_length: int | None = None
    vocab_tokens: int = 0  # tokenizer.ggml.tokens
    split_count: int = 1
    chat_template: bool = False

    @property
    def task(self) -> str:
        """"causal-lm", "encoder", or "" for a file that is not a model llama.cpp's server generates with."""
        if self.kind != "model" or self.architecture in NOT_TEXT:
            return ""
        return "encoder" if self.architecture in ENCODERS else "causal-lm"

    @property
    def head_dim(self) -> int | None:
        if self.key_length:
            return self.key_length
        if self.embedding_length and self.head_count:
            return self.embedding_length // self.head_count
        return None

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """The KV cache one token takes across every layer (F16 keys and values by default); 0 where the header
        does not tell."""
        if not (self.block_count and self.head_count_kv and self.head_dim):
            return 0
        value = self.value_length or self.head_dim
        return self.block_count * self.head_count_kv * (self.head_dim + value) * bytes_per_value

    def shape(self) -> ModelShape:
        """The file as the engines' capability checks read a model."""
        return ModelShape(architecture=self.architecture, model_type=GGUF, task=self.task,
                          stored_dtype=self.quantization, head_dim=self.head_dim,
                          vocab_size=self.vocab_tokens or None, tokenizer_ids=self.vocab_tokens or None, format=GGUF)

    def artifact(self, path: Path) -> ModelArtifact:
        """The file as registration and the agent read a model (`path`: where it was found, resolved). Its config
        holds what it declares under config.json's names (sizes, positions), for the shape and the context."""
        declared = {"hidden_size": self.embedding_length, "vocab_size": self.vocab_tokens or None,
                    "num_hidden_layers": self.block_count, "num_attention_heads": self.head_count,
                    "num_key_value_heads": self.head_count_kv, "head_dim": self.head_dim,
                    "max_position_embeddings": self.context_length}
        config = {"model_type": GGUF, "architectures": [self.architecture]} | {
            k: v for k, v in declared.items() if v is not None}
        return ModelArtifact(path=path, architecture=self.architecture, model_type=GGUF, task=self.task,
                             stored_dtype=self.quantization, weights_bytes=self.weights_bytes,
                             parameters=self.parameters, files=(path,), config=config, format=GGUF)


def is_gguf(path: str | Path) -> bool:
    """Whether `path` is a file that starts as GGUF does."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def read_gguf(path: str | Path) -> GgufFacts:
    """The facts of the GGUF file at `path`; ArtifactError saying why when it is no GGUF file, or one this
    version of llama.cpp cannot read (an unknown tensor type, a cut-off header)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path} is not a file")
    if not is_gguf(path):
        raise ArtifactError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError, EOFError) as e:
        raise ArtifactError(f"{path.name} cannot be read as GGUF by gguf {_version()}: {e}") from None
    values = {name: _value(f) for name, f in reader.fields.items() if not name.startswith("tokenizer.ggml.")}
    arch = values.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ArtifactError(f"{path.name} names no general.architecture")

    def number(key: str) -> int | None:
        found = values.get(f"{arch}.{key}")
        if isinstance(found, list):  # per layer (some families vary KV heads by layer): the largest
            found = max(found, default=None)
        return int(found) if isinstance(found, int | float) else None

    by_type: Counter[str] = Counter()
    bytes_by_type: Counter[str] = Counter()
    for tensor in reader.tensors:
        by_type[tensor.tensor_type.name] += 1
        bytes_by_type[tensor.tensor_type.name] += int(tensor.n_bytes)
    parameters = sum(int(tensor.n_elements) for tensor in reader.tensors)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return GgufFacts(
        path=str(path), file_bytes=os.path.getsize(path), architecture=arch,
        kind=str(values.get("general.type") or "model"), name=str(values.get("general.name") or path.stem),
        quantization=_quantization(values.get("general.file_type"), bytes_by_type),
        tensor_types=dict(by_type), weights_bytes=sum(bytes_by_type.values()), parameters=parameters,
        context_length=number("context_length"), embedding_length=number("embedding_length"),
        block_count=number("block_count"), head_count=number("attention.head_count"),
        head_count_kv=number("attention.head_count_kv") or number("attention.head_count"),
        key_length=number("attention.key_length"), value_length=number("attention.value_length"),
        vocab_tokens=len(tokens.data) if tokens is not None else 0,
        split_count=int(values.get("split.count") or 1),
        chat_template=isinstance(values.get("tokenizer.chat_template"), str),
    )


def file_refusal(facts: GgufFacts) -> str:
    """Why llama.cpp's server cannot serve this file as a model, from what only the file tells (the rest is the
    engine's check of its shape); "" when it can."""
    if facts.kind != "model":
        return (f"{Path(facts.path).name} is a GGUF {facts.kind}, not a model: llama.cpp's server loads it only "
                "beside a model")
    if facts.split_count > 1:
        return (f"{Path(facts.path).name} is one of {facts.split_count} parts of a split GGUF: merge them into one "
                "file (llama-gguf-split --merge)")
    if not facts.vocab_tokens:
        return f"{Path(facts.path).name} holds no vocabulary (tokenizer.ggml.tokens): llama.cpp cannot tokenize for it"
    return ""


def _quantization(file_type: object, bytes_by_type: Counter[str]) -> str:
    import gguf

    if isinstance(file_type, int):
        try:
            name = gguf.LlamaFileType(file_type).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    return bytes_by_type.most_common(1)[0][0] if bytes_by_type else ""


def _value(field) -> object:
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gguf")
    except metadata.PackageNotFoundError:
        return "(unknown)"
