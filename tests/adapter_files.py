"""PEFT-layout LoRA adapter directories written with numpy, for tests that need no torch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def write_adapter(path: Path, modules: dict[str, tuple[int, int, int]], *, seed: int = 0, **config) -> Path:
    """Write adapter_config.json and adapter_model.safetensors; `modules` maps a module to (rank, in, out)."""
    path.mkdir(parents=True, exist_ok=True)
    body = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["up_proj"],
            "base_model_name_or_path": "tiny", "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}} | config
    (path / "adapter_config.json").write_text(json.dumps(body))
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, (rank, fan_in, fan_out) in modules.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = rng.standard_normal((rank, fan_in), np.float32) * 0.1
        tensors[f"base_model.model.{name}.lora_B.weight"] = rng.standard_normal((fan_out, rank), np.float32) * 0.1
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return path
