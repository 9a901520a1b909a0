"""The environment of every process the agent starts (replica workers, text processes, engine servers): what a
Python, torch or vLLM process needs from the agent's own, by an allowlist, and no secret.

The agent's environment holds its token, and under the embedded `manage.py up` the console's too (its database
URL, the admin password, Django's secret key). A worker runs a team's model and an engine runs a team's flags: each
gets the paths, locale, temporary and cache directories, and the CUDA, NVIDIA, thread and engine settings below,
and nothing else. A name that looks like a secret is dropped even where its prefix is kept (HF_TOKEN,
VLLM_API_KEY: an engine is given its own key, by its starter).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# Kept by name: finding programs and libraries, the user, temporary and cache directories, locale and time zone.
KEPT_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TEMP", "TMP", "LANG", "LANGUAGE", "TZ",
    "LD_LIBRARY_PATH", "LD_PRELOAD",  # CUDA's libraries; vLLM's CPU build preloads tcmalloc and an OpenMP runtime
    "CC", "CXX",  # torch's inductor compiles kernels (vLLM on CPU) with the C compiler these name
    "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
})
# Kept by prefix: locale categories, CUDA and NVIDIA settings (devices, MPS pipes, NCCL), thread pools, torch's and
# Triton's caches and allocators, and the engine's own settings (VLLM_*, FlashInfer's workspace).
KEPT_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH",
                 "PYTORCH_", "TRITON_", "VLLM_", "FLASHINFER_")
# Dropped whatever its prefix: names that hold credentials.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH|COOKIE", re.IGNORECASE)


def child_environment(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a process the agent starts inherits from `source` (the agent's environment by default): the allowlist,
    without names that look like secrets. The caller adds what the process needs of its own."""
    source = os.environ if source is None else source
    return {name: value for name, value in source.items()
            if (name in KEPT_NAMES or name.startswith(KEPT_PREFIXES)) and not SECRET_NAME.search(name)}


def allowlist_markdown() -> str:
    """The allowlist as docs/engines.md shows it (a test keeps the doc equal to this)."""
    names = ", ".join(f"`{n}`" for n in sorted(KEPT_NAMES))
    prefixes = ", ".join(f"`{p}*`" for p in KEPT_PREFIXES)
    return (f"- by name: {names};\n- by prefix: {prefixes};\n"
            f"- never a name matching `{SECRET_NAME.pattern}` (any case), whatever its prefix.")
