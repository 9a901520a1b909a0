"""The llama-server flags a deployment may set, with what each takes (llama.cpp as `make llamacpp` builds it).

Long forms only, and only flags that tune how it serves: context and slots, threads and batches, its KV cache's
types, sampling defaults. ModelGrid sets the model, the name, the address, the key, the GPU layers and the web
surfaces itself; nothing that reads or writes a file, downloads, or runs tools is taken (the refusals below say
why, as a deployment's error shows them).
"""

from __future__ import annotations

from agent.protocol.engine_args import Allowlist
from agent.protocol.engine_args.kinds import Choice, Float, Int

MAX_CONTEXT = 1 << 20  # tokens across every slot: llama-server allocates its KV cache for all of them at start
MAX_SLOTS = 256
MAX_THREADS = 512
MAX_BATCH = 65_536
# ggml's KV cache types that llama-server's --cache-type-k/v take.
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

_SET_BY_MODELGRID = "ModelGrid sets it"
_FILES = "it reads or writes files on the host"
_TOOLS = "it runs tools or proxies requests on the host"
_NET = "it downloads from the network"

ALLOWLIST = Allowlist(
    switches={
        "--cont-batching": (), "--no-cont-batching": (),
        "--context-shift": (), "--no-context-shift": (),
        "--kv-unified": (), "--no-kv-unified": (),
        "--swa-full": (),
        "--no-mmap": (),
        "--cache-prompt": (), "--no-cache-prompt": (),
    },
    valued={
        "--ctx-size": Int(16, MAX_CONTEXT),
        "--parallel": Int(1, MAX_SLOTS),
        "--threads": Int(1, MAX_THREADS),
        "--threads-batch": Int(1, MAX_THREADS),
        "--batch-size": Int(1, MAX_BATCH),
        "--ubatch-size": Int(1, MAX_BATCH),
        "--n-predict": Int(1, MAX_CONTEXT),
        "--cache-reuse": Int(0, MAX_CONTEXT),
        "--cache-type-k": Choice(CACHE_TYPES),
        "--cache-type-v": Choice(CACHE_TYPES),
        "--flash-attn": Choice(("on", "off", "auto")),
        "--reasoning-format": Choice(("none", "deepseek", "deepseek-legacy", "auto")),
        "--reasoning-budget": Int(0, MAX_CONTEXT),
        "--temp": Float(0, 10),
        "--top-k": Int(0, 1_000_000),
        "--top-p": Float(0, 1),
        "--min-p": Float(0, 1),
        "--repeat-penalty": Float(0, 10),
        "--seed": Int(0, 4_294_967_295),
    },
    refused={
        **dict.fromkeys(("--model", "-m", "--alias", "-a", "--host", "--port", "--api-key", "--api-key-file",
                         "--n-gpu-layers", "--gpu-layers", "-ngl", "--metrics", "--slots", "--no-slots", "--props",
                         "--webui", "--no-webui", "--jinja", "--no-jinja", "--offline"), _SET_BY_MODELGRID),
        **dict.fromkeys(("--chat-template-file", "--slot-save-path", "--media-path", "--lora", "--lora-scaled",
                         "--mmproj", "--log-file", "--ssl-key-file", "--ssl-cert-file", "--models-dir",
                         "--models-preset", "--grammar-file", "--json-schema-file", "--ui-config-file",
                         "--control-vector"), _FILES),
        **dict.fromkeys(("--tools", "--agent", "--mcp-servers-config", "--mcp-servers-json", "--webui-mcp-proxy",
                         "--ui-mcp-proxy", "--tools-runtime"), _TOOLS),
        **dict.fromkeys(("--hf-repo", "-hf", "--model-url", "-mu", "--hf-file", "--docker-repo"), _NET),
    },
)
