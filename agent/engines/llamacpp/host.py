"""llama.cpp's server in this process, through xllamacpp's prebuilt wheel, started with llama-server's flags:
`PYTHON host.py FLAGS`, where PYTHON has xllamacpp (the agent's own interpreter, or a CUDA wheel's on a GPU host).

server.py runs it as a script, so it imports nothing of ModelGrid: any interpreter with xllamacpp runs it. It takes
the flags launch.py writes and settings.py allows (a test holds the three together), its key from LLAMA_API_KEY as
llama-server does, and serves until SIGTERM. A flag it does not know ends it with code 2, saying which.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import xllamacpp as xlc


def _choice(kind, names: dict[str, str]):
    return lambda value: getattr(kind, names[value])


_CACHE_TYPE = lambda value: getattr(xlc.ggml_type, f"GGML_TYPE_{value.upper()}")  # noqa: E731  f16, q8_0, ...
_FLASH = _choice(xlc.llama_flash_attn_type, {"on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
                                             "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
                                             "auto": "LLAMA_FLASH_ATTN_TYPE_AUTO"})
_REASONING = _choice(xlc.common_reasoning_format, {"none": "COMMON_REASONING_FORMAT_NONE",
                                                   "auto": "COMMON_REASONING_FORMAT_AUTO",
                                                   "deepseek": "COMMON_REASONING_FORMAT_DEEPSEEK",
                                                   "deepseek-legacy": "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY"})
_COLORS = {"on": True, "off": False, "auto": False}.__getitem__

# llama-server's switches, as the CommonParams field each sets and its value.
SWITCHES = {
    "--no-webui": ("ui", False), "--no-slots": ("endpoint_slots", False), "--metrics": ("endpoint_metrics", True),
    "--jinja": ("use_jinja", True), "--offline": ("offline", True),
    "--cont-batching": ("cont_batching", True), "--no-cont-batching": ("cont_batching", False),
    "--context-shift": ("ctx_shift", True), "--no-context-shift": ("ctx_shift", False),
    "--kv-unified": ("kv_unified", True), "--no-kv-unified": ("kv_unified", False),
    "--swa-full": ("swa_full", True),
    "--no-mmap": ("load_mode", xlc.llama_load_mode.LLAMA_LOAD_MODE_NONE),
    "--cache-prompt": ("cache_prompt", True), "--no-cache-prompt": ("cache_prompt", False),
}
# Its flags that take a value, as the field each sets and how the value is read.
VALUED = {
    "--model": ("model.path", str), "--alias": ("model_alias", lambda value: {value}),
    "--host": ("hostnames", lambda value: [value]), "--port": ("port", int), "--log-colors": ("use_color", _COLORS),
    "--n-gpu-layers": ("n_gpu_layers", int),
    "--ctx-size": ("n_ctx", int), "--parallel": ("n_parallel", int),
    "--threads": ("cpuparams.n_threads", int), "--threads-batch": ("cpuparams_batch.n_threads", int),
    "--batch-size": ("n_batch", int), "--ubatch-size": ("n_ubatch", int), "--n-predict": ("n_predict", int),
    "--cache-reuse": ("n_cache_reuse", int),
    "--cache-type-k": ("cache_type_k", _CACHE_TYPE), "--cache-type-v": ("cache_type_v", _CACHE_TYPE),
    "--flash-attn": ("flash_attn_type", _FLASH), "--reasoning-format": ("reasoning_format", _REASONING),
    "--reasoning-budget": ("sampling.reasoning_budget_tokens", int),
    "--temp": ("sampling.temp", float), "--top-k": ("sampling.top_k", int), "--top-p": ("sampling.top_p", float),
    "--min-p": ("sampling.min_p", float), "--repeat-penalty": ("sampling.penalty_repeat", float),
    "--seed": ("sampling.seed", int),
}


def params(argv: list[str], key: str = "") -> xlc.CommonParams:
    """CommonParams for llama-server's command line `argv`; ValueError naming a flag it does not take."""
    made = xlc.CommonParams()
    made.api_keys = [key] if key else []
    flags = iter(argv)
    for flag in flags:
        if flag in SWITCHES:
            field, value = SWITCHES[flag]
        elif flag in VALUED:
            field, read = VALUED[flag]
            given = next(flags, None)
            if given is None:
                raise ValueError(f"{flag} needs a value")
            value = read(given)
        else:
            raise ValueError(f"unknown flag {flag}")
        owner, _, name = field.rpartition(".")
        setattr(getattr(made, owner) if owner else made, name, value)
    return made


def main(argv: list[str]) -> int:
    try:
        settings = params(argv, os.environ.get("LLAMA_API_KEY", ""))
    except (ValueError, KeyError, AttributeError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        server = xlc.Server(settings)  # loads the model and serves HTTP on its own threads
    except Exception as e:  # noqa: BLE001 - its load's own error, told as llama-server tells it
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    stop.wait()
    del server  # its destructor ends the main loop and the HTTP threads
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
