"""The vLLM flags a deployment may set, with what each takes: types and choices as vLLM 0.32's own parser has
them (its parser's choices, its parsers' registries, its config classes' literals), and ranges that keep a replica
startable on one host. tests/agent/engines/vllm/test_settings_parser.py runs vLLM's real parser over samples to keep
this table inside what vLLM takes.

Nothing here names a file or module vLLM would import or run: no plugin flags (`--tool-parser-plugin`,
`--reasoning-parser-plugin`, `--io-processor-plugin`, `--logits-processors`, `--worker-cls`, ...), no
`reasoning_parser_plugin` key, no chat templates, no remote code, no pickles; the one path (`--generation-config`,
which vLLM reads generation_config.json from) must lie inside the model roots.
"""

from __future__ import annotations

from typing import Any

from agent.protocol.engine_args import Allowlist
from agent.protocol.engine_args.kinds import (
    Choice,
    Float,
    Int,
    JBool,
    JChoice,
    JNumber,
    JsonObject,
    ModelDir,
    ValueKind,
)

MAX_GPUS_PER_REPLICA = 16  # a replica's GPUs are a gang on one host (the console's gpus_per_replica bound)
MAX_NUM_SEQS = 1024  # vLLM sizes per-sequence buffers (a logits row each) from it at start
MAX_BATCHED_TOKENS = 131_072

TOOL_CALL_PARSERS = (
    "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31", "deepseek_v32", "deepseek_v4",
    "deepseek_v41", "dots", "ernie45", "functiongemma", "gemma4", "gigachat3", "glm45", "glm47", "granite",
    "granite-20b-fc", "granite4", "hermes", "hf", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba",
    "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json", "llama4_pythonic", "longcat",
    "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral", "muse_glimmer", "olmo3", "openai", "phi4_mini_json",
    "plamo3", "poolside_v1", "pythonic", "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5",
    "xlam",
)
REASONING_PARSERS = (
    "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4", "deepseek_v41", "ernie45",
    "gemma4", "glm45", "glm47", "granite", "granite_thinking_parser", "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4",
    "inkling", "k2_horizon", "kimi_k2", "kimi_k3", "ling3", "mimo", "minicpmv", "minimax_m2",
    "minimax_m2_append_think", "minimax_m3", "mistral", "muse_glimmer", "nemotron_v3", "olmo3", "openai_gptoss",
    "plamo3", "poolside_v1", "qwen3", "seed_oss", "step3", "step3p5",
)
# vLLM's QuantizationMethods, less the deprecated ones (fbgemm_fp8, fp_quant), which need a flag of their own.
QUANTIZATIONS = (
    "awq", "auto_awq", "fp8", "modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq",
    "gptq_marlin", "awq_marlin", "humming", "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao",
    "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block",
    "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
)
KV_CACHE_DTYPES = (
    "auto", "bfloat16", "float16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head",
    "int4_per_token_head", "int8_per_token_head", "nvfp4", "nvfp4_4over6", "nvfp4_ds_mla", "turboquant_3bit_nc",
    "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_k8v4", "ultraquant_4bit",
)
TOKENIZER_MODES = ("auto", "hf", "mistral", "deepseek_v32", "deepseek_v4", "inkling", "kimi_k3", "cohere")
STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")


def _structured_outputs_rule(config: dict[str, Any]) -> str | None:
    """vLLM's StructuredOutputsConfig validator, as its parser applies it."""
    backend = config.get("backend", "auto")
    if config.get("disable_any_whitespace") and backend not in ("xgrammar", "guidance"):
        return "'disable_any_whitespace' needs \"backend\": \"xgrammar\" or \"guidance\" beside it"
    if config.get("disable_additional_properties") and backend != "guidance":
        return "'disable_additional_properties' needs \"backend\": \"guidance\" beside it"
    return None


STRUCTURED_OUTPUTS = JsonObject({
    "backend": JChoice(STRUCTURED_OUTPUT_BACKENDS),
    "disable_any_whitespace": JBool(),
    "disable_additional_properties": JBool(),
    "reasoning_parser": JChoice(("", *REASONING_PARSERS), 'one of --reasoning-parser\'s values, or ""'),
    "enable_in_reasoning": JBool(),
}, rule=_structured_outputs_rule)

# The sampling defaults vLLM reads from a generation config (ModelConfig.get_diff_sampling_param).
GENERATION_OVERRIDES = JsonObject({
    "temperature": JNumber(0, 2),
    "top_p": JNumber(0, 1),
    "top_k": JNumber(-1, 1_000_000, integer=True),
    "min_p": JNumber(0, 1),
    "repetition_penalty": JNumber(0.01, 2),
    "presence_penalty": JNumber(-2, 2),
    "frequency_penalty": JNumber(-2, 2),
    "max_new_tokens": JNumber(1, MAX_BATCHED_TOKENS, integer=True),
})

# Switches: each stands alone (its --no- form where vLLM has one). A switch that needs another flag names it.
SWITCHES: dict[str, tuple[str, ...]] = {
    "--enable-auto-tool-choice": ("--tool-call-parser",),
    "--enable-prefix-caching": (),
    "--no-enable-prefix-caching": (),
    "--enable-chunked-prefill": (),
    "--no-enable-chunked-prefill": (),
    "--enforce-eager": (),
    "--no-enforce-eager": (),
    "--enable-prompt-tokens-details": (),
    "--return-tokens-as-token-ids": (),
    "--enable-log-requests": (),
    "--no-enable-log-requests": (),
    "--async-scheduling": (),
    "--no-async-scheduling": (),
}

# Flags that take a value (the next argument, or --flag=value), with what each takes.
VALUED: dict[str, ValueKind] = {
    "--tool-call-parser": Choice(TOOL_CALL_PARSERS, "vLLM 0.32's tool-call parsers"),
    "--reasoning-parser": Choice(REASONING_PARSERS, "vLLM 0.32's reasoning parsers"),
    "--chat-template-content-format": Choice(("auto", "openai", "string")),
    "--max-num-seqs": Int(1, MAX_NUM_SEQS),
    "--max-num-batched-tokens": Int(1, MAX_BATCHED_TOKENS),
    "--long-prefill-token-threshold": Int(0, MAX_BATCHED_TOKENS),
    "--scheduling-policy": Choice(("fcfs", "priority")),
    "--quantization": Choice(QUANTIZATIONS, "vLLM 0.32's quantization methods"),
    "--kv-cache-dtype": Choice(KV_CACHE_DTYPES),
    # Those both builds take: vLLM's CPU build refuses blocks that are not a multiple of 32 at start (CUDA's default
    # of 16 applies when the flag is left out).
    "--block-size": Choice(("32", "64", "128", "256")),
    "--cpu-offload-gb": Float(0, 1024),
    "--seed": Int(0, 2**32 - 1),
    "--max-logprobs": Int(0, 20),  # as many as a request may ask for (agent.serving.request_bounds)
    "--logprobs-mode": Choice(("processed_logits", "processed_logprobs", "raw_logits", "raw_logprobs")),
    "--tokenizer-mode": Choice(TOKENIZER_MODES),
    "--tensor-parallel-size": Int(1, MAX_GPUS_PER_REPLICA),
    "--pipeline-parallel-size": Int(1, MAX_GPUS_PER_REPLICA),
    "--structured-outputs-config": STRUCTURED_OUTPUTS,
    "--generation-config": ModelDir(("auto", "vllm")),
    "--override-generation-config": GENERATION_OVERRIDES,
}

# Refused with a reason of their own. Flags that name a file or module vLLM imports or reads (code as the agent's
# user, or the host's files), and a config file that could set any flag:
IMPORTS_CODE = (
    "--tool-parser-plugin", "--reasoning-parser-plugin", "--io-processor-plugin", "--logits-processors",
    "--worker-cls", "--worker-extension-cls", "--scheduler-cls", "--chat-template", "--config", "--tokenizer",
    "--hf-overrides", "--model-loader-extra-config", "--trust-remote-code", "--load-format",
)
# Flags vLLM 0.32 no longer has: its parser refuses them, so a replica given one fails at every start.
GONE = ("--disable-log-requests", "--swap-space", "--max-seq-len-to-capture", "--max-num-partial-prefills")

# Flags whose product is the GPUs one replica spans.
PARALLEL_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size")

ALLOWLIST = Allowlist(
    switches=SWITCHES, valued=VALUED, parallel_flags=PARALLEL_FLAGS, max_gpus=MAX_GPUS_PER_REPLICA,
    refused={flag: "it names a file, module or code that vLLM would load as the agent's user" for flag in IMPORTS_CODE}
    | {flag: "vLLM 0.32 no longer has it, and its parser refuses it at every start" for flag in GONE},
)
