"""Read a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) without torch.

Only what a multi-LoRA forward can serve is accepted: plain low-rank deltas on weight matrices.
Features that change the forward in other ways (DoRA, extra biases, whole replaced modules,
embedding LoRA) are refused here, with the field that asks for them, so registration fails
instead of a worker serving something other than what was trained.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.artifacts.dtypes import dtype_bytes
from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.files import Roots, kind_of, read_json, real_path
from agent.artifacts.limits import MAX_LORA_RANK, MAX_PATTERNS
from agent.artifacts.model_dir import ModelArtifact, model_path
from agent.artifacts.patterns import PatternMatcher
from agent.artifacts.safetensors_header import TensorInfo, read_safetensors_header
from agent.artifacts.tree import check_tree

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")

# Config fields that PEFT honours in the forward but a plain multi-LoRA layer does not.
_UNSERVABLE = {
    "use_dora": "DoRA rescales the whole weight per adapter",
    "lora_bias": "LoRA biases add a per-adapter bias vector",
    "modules_to_save": "modules_to_save replaces whole modules per adapter",
    "trainable_token_indices": "trainable tokens replace embedding rows per adapter",
    "layer_replication": "layer replication changes the base model's layer stack",
    "target_parameters": "LoRA on bare parameters (MoE experts) is not a linear-layer delta",
    "alora_invocation_tokens": "activated LoRA switches on mid-sequence",
    "use_qalora": "QA-LoRA pools the input per group",
}


@dataclass(frozen=True)
class LoraModule:
    """One targeted weight: its A [rank, in] and B [out, rank] tensors and its scaling."""

    name: str  # module path in the base model, e.g. "model.layers.0.self_attn.q_proj"
    rank: int
    alpha: float
    scale: float  # alpha / rank, or alpha / sqrt(rank) with rsLoRA
    in_features: int
    out_features: int
    a_key: str
    b_key: str


@dataclass(frozen=True)
class AdapterArtifact:
    path: Path
    base_model: str  # base_model_name_or_path as trained; informational, paths differ between machines
    r: int
    lora_alpha: float
    use_rslora: bool
    fan_in_fan_out: bool
    target_modules: tuple[str, ...] | str  # a list of names, or one regular expression
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    modules: tuple[LoraModule, ...]
    stored_dtype: str  # safetensors dtype of the A/B tensors, e.g. "F32"
    stored_bytes: int
    tensors: tuple[TensorInfo, ...] = field(repr=False)

    @property
    def ranks(self) -> dict[str, int]:
        return {m.name: m.rank for m in self.modules}

    @property
    def parameters(self) -> int:
        return sum(m.rank * (m.in_features + m.out_features) for m in self.modules)

    def bytes_at(self, dtype: str) -> int:
        """Bytes the A/B tensors take when held in the serving dtype `dtype` ("float16", "bf16", ...)."""
        return self.parameters * dtype_bytes(dtype)


@dataclass(frozen=True)
class AdapterFit:
    """An adapter checked against a base model: which base tensor each module adapts, and its bytes."""

    dtype: str
    nbytes: int
    base_tensors: dict[str, str]  # adapter module -> base model tensor name


def read_adapter_dir(path: str | Path, roots: Roots = None) -> AdapterArtifact:
    """Read and validate a PEFT LoRA adapter directory; ArtifactError names the file and field at fault.

    With `roots`, the directory and every file read must resolve inside them.
    """
    path = model_path(path, roots)
    kind = kind_of(path, roots)
    if kind == "missing":
        raise ArtifactError(f"{path}: no such directory")
    if kind != "dir":
        raise ArtifactError(f"{path}: not a directory (a LoRA adapter is a directory with {CONFIG_NAME})")
    config_path = path / CONFIG_NAME
    if kind_of(config_path, roots) == "missing":
        raise ArtifactError(f"{path}: no {CONFIG_NAME}, so this is not a PEFT adapter directory")
    check_tree(path, roots)  # every file the worker may read from it, not only the two read here
    matcher = PatternMatcher(str(config_path))
    config = _read_config(config_path, roots, matcher)
    weights = path / WEIGHTS_NAME
    if kind_of(weights, roots) == "missing":
        has_pickle = kind_of(path / "adapter_model.bin", roots) != "missing"
        pickle = " (adapter_model.bin is a pickle and is never loaded)" if has_pickle else ""
        raise ArtifactError(f"{path}: no {WEIGHTS_NAME}{pickle}")
    tensors = read_safetensors_header(weights, roots)
    modules = _modules(weights, tensors, config, matcher)
    return AdapterArtifact(
        path=real_path(path, roots),
        base_model=str(config.get("base_model_name_or_path") or ""),
        r=config["r"],
        lora_alpha=config["lora_alpha"],
        use_rslora=config["use_rslora"],
        fan_in_fan_out=config["fan_in_fan_out"],
        target_modules=config["target_modules"],
        rank_pattern=config["rank_pattern"],
        alpha_pattern=config["alpha_pattern"],
        modules=modules,
        stored_dtype=_stored_dtype(tensors),
        stored_bytes=sum(t.nbytes for t in tensors),
        tensors=tuple(tensors),
    )


def check_adapter_matches(adapter: AdapterArtifact, model: ModelArtifact, dtype: str | None = None) -> AdapterFit:
    """Check that every A/B pair fits a weight of `model`; returns the adapter's bytes at `dtype`.

    `dtype` defaults to the model's stored dtype. A GPT-2 style Conv1D weight is stored [in, out].
    """
    dtype = dtype or model.stored_dtype
    shapes = {t.name: t.shape for t in model.tensors}
    transposed_ok = adapter.fan_in_fan_out or model.model_type == "gpt2"
    base_tensors = {}
    for m in adapter.modules:
        name = _base_tensor(m.name, shapes)
        if name is None:
            raise ArtifactError(
                f"{adapter.path}: adapter targets {m.name}, but the base model {model.path} has no "
                f"tensor {m.name}.weight"
            )
        shape = list(shapes[name])
        fits = shape == [m.out_features, m.in_features] or (transposed_ok and shape == [m.in_features, m.out_features])
        if not fits:
            raise ArtifactError(
                f"{adapter.path}: adapter targets {m.name} with in={m.in_features}, out={m.out_features}; "
                f"the base model's tensor is {shape}"
            )
        base_tensors[m.name] = name
    return AdapterFit(dtype=dtype, nbytes=adapter.bytes_at(dtype), base_tensors=base_tensors)


def _read_config(config_path: Path, roots: Roots, matcher: PatternMatcher) -> dict[str, Any]:
    config = read_json(config_path, roots)
    if not isinstance(config, dict):
        raise ArtifactError(f"{config_path}: not a JSON object")

    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise ArtifactError(
            f"{config_path}: peft_type is {shown(peft_type)}; ModelGrid serves LoRA adapters only (LORA)"
        )
    for name, why in _UNSERVABLE.items():
        if config.get(name):
            raise ArtifactError(f"{config_path}: {name} is set; {why}, which ModelGrid's adapter pool cannot serve")
    if config.get("bias", "none") != "none":
        raise ArtifactError(
            f"{config_path}: bias is {shown(config['bias'])}; trained base-model biases change the base weights, "
            "which ModelGrid's adapter pool shares between adapters (needs 'none')"
        )

    r = config.get("r")
    if not _is_rank(r):
        raise ArtifactError(f"{config_path}: r must be an integer from 1 to {MAX_LORA_RANK:,}, got {shown(r)}")
    alpha = config.get("lora_alpha", 8)
    if not _is_number(alpha):
        raise ArtifactError(f"{config_path}: lora_alpha must be a finite number, got {shown(alpha)}")
    patterns = {}
    for name, valid, accepted in (("rank_pattern", _is_rank, f"integer ranks from 1 to {MAX_LORA_RANK:,}"),
                                  ("alpha_pattern", _is_number, "finite numbers")):
        value = config.get(name) or {}
        if not isinstance(value, dict) or len(value) > MAX_PATTERNS or not all(valid(v) for v in value.values()):
            raise ArtifactError(
                f"{config_path}: {name} must map at most {MAX_PATTERNS:,} module patterns to {accepted}, "
                f"got {shown(value)}"
            )
        matcher.check_pattern_keys(name, value)
        patterns[name] = value
    targets = config.get("target_modules")
    if isinstance(targets, list) and len(targets) <= MAX_PATTERNS and all(isinstance(t, str) for t in targets):
        targets = tuple(targets)
    elif isinstance(targets, str):
        matcher.check_target_pattern(targets)
    else:
        raise ArtifactError(
            f"{config_path}: target_modules must be a list of at most {MAX_PATTERNS:,} module names or one pattern, "
            f"got {shown(targets)}"
        )
    return {
        "base_model_name_or_path": config.get("base_model_name_or_path"),
        "r": r,
        "lora_alpha": alpha,
        "use_rslora": bool(config.get("use_rslora", False)),
        "fan_in_fan_out": bool(config.get("fan_in_fan_out", False)),
        "target_modules": targets,
        **patterns,
    }


def _modules(
    weights: Path, tensors: list[TensorInfo], config: dict[str, Any], matcher: PatternMatcher
) -> tuple[LoraModule, ...]:
    pairs: dict[str, dict[str, TensorInfo]] = {}
    for t in tensors:
        match = _KEY.match(t.name)
        if not match:
            hint = " (a modules_to_save or bias tensor)" if t.name.startswith(_PREFIX) else ""
            raise ArtifactError(
                f"{weights}: tensor {shown(t.name)} is not a LoRA A/B weight{hint}; "
                "expected base_model.model.<module>.lora_A.weight and .lora_B.weight"
            )
        if len(t.shape) != 2:
            raise ArtifactError(f"{weights}: tensor {shown(t.name)} has shape {list(t.shape)}, a LoRA weight is 2-D")
        pairs.setdefault(match["module"], {})[match["part"]] = t
    if not pairs:
        raise ArtifactError(f"{weights}: holds no LoRA tensors")

    modules = []
    for name, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise ArtifactError(f"{weights}: module {name} has no {missing}.weight")
        a, b = pair["A"], pair["B"]
        rank, in_features = a.shape
        out_features, b_rank = b.shape
        if b_rank != rank:
            raise ArtifactError(
                f"{weights}: module {name} has lora_A {list(a.shape)} but lora_B {list(b.shape)}; "
                "their ranks differ"
            )
        targets = config["target_modules"]
        if isinstance(targets, str) and not matcher.targets(targets, name):
            raise ArtifactError(
                f"{weights}: module {name} is not selected by target_modules {shown(targets)} in {CONFIG_NAME} "
                "(PEFT matches the whole module name), so PEFT would not load its weights"
            )
        expected = matcher.pattern_value("rank_pattern", config["rank_pattern"], name, config["r"])
        if rank != expected:
            raise ArtifactError(
                f"{weights}: module {name} has rank {rank}, but adapter_config.json says {expected} "
                "(r / rank_pattern)"
            )
        alpha = float(matcher.pattern_value("alpha_pattern", config["alpha_pattern"], name, config["lora_alpha"]))
        scale = alpha / math.sqrt(rank) if config["use_rslora"] else alpha / rank
        modules.append(LoraModule(name, rank, alpha, scale, in_features, out_features, a.name, b.name))
    return tuple(modules)


def match_module(module: str, names: Iterable[str]) -> str | None:
    """The name in `names` that an adapter's module refers to, allowing one wrapper prefix on either side.

    Hub checkpoints are often saved from the bare model (GPT-2: "h.0.attn.c_attn") while the adapter was
    trained on the head model ("transformer.h.0.attn.c_attn"), or the other way round (an adapter trained
    on BertForSequenceClassification names "bert.encoder...", a served BertModel "encoder...").
    """
    names = set(names)
    if module in names:
        return module
    _, _, rest = module.partition(".")
    if rest in names:
        return rest
    longer = [n for n in names if n.endswith(f".{module}") and n.count(".") == module.count(".") + 1]
    return longer[0] if len(longer) == 1 else None


def _base_tensor(module: str, shapes: dict[str, tuple[int, ...]]) -> str | None:
    weights = [name.removesuffix(".weight") for name in shapes if name.endswith(".weight")]
    found = match_module(module, weights)
    return None if found is None else f"{found}.weight"


def _stored_dtype(tensors: list[TensorInfo]) -> str:
    by_dtype: dict[str, int] = {}
    for t in tensors:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    return max(by_dtype, key=by_dtype.get) if by_dtype else ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LORA_RANK
