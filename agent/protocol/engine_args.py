"""What a deployment may add to its engine's command line: vLLM flags that tune how it serves (tool-call and
reasoning parsers, prefix caching, batch limits, quantization, ...). ModelGrid sets the model, the names, the
address, the key, the memory and LoRA itself, and nothing that runs code from the model directory or loads
pickles is passed: the list is what is allowed, not what is refused. Checked by the console when a deployment
is saved and again by the agent before it starts vLLM."""

from __future__ import annotations

MAX_ENGINE_ARGS = 32
MAX_ARG_CHARS = 200

# Flags that take a value (the next argument, or --flag=value) and flags that stand alone.
VALUED_FLAGS = frozenset({
    "--tool-call-parser", "--reasoning-parser", "--chat-template-content-format", "--max-num-seqs",
    "--max-num-batched-tokens", "--quantization", "--kv-cache-dtype", "--block-size", "--seed",
    "--max-logprobs", "--structured-outputs-config", "--generation-config", "--override-generation-config",
    "--tokenizer-mode", "--swap-space", "--cpu-offload-gb", "--max-seq-len-to-capture", "--tensor-parallel-size",
    "--pipeline-parallel-size", "--long-prefill-token-threshold", "--max-num-partial-prefills",
    "--scheduling-policy", "--logprobs-mode",
})
SWITCHES = frozenset({
    "--enable-auto-tool-choice", "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--enforce-eager", "--enable-prompt-tokens-details", "--return-tokens-as-token-ids",
    "--enable-log-requests", "--disable-log-requests", "--async-scheduling", "--no-async-scheduling",
})


def engine_args_problem(args: list[str]) -> str | None:
    """Why `args` cannot be passed to vLLM, naming the first argument at fault; None when they all can."""
    if len(args) > MAX_ENGINE_ARGS:
        return f"at most {MAX_ENGINE_ARGS} engine arguments are taken, not {len(args)}"
    for i, arg in enumerate(args):
        if not isinstance(arg, str) or not arg or len(arg) > MAX_ARG_CHARS or not arg.isprintable():
            return f"engine argument {i + 1} must be printable text of 1 to {MAX_ARG_CHARS} characters"
    i = 0
    while i < len(args):
        arg = args[i]
        flag, equals, _ = arg.partition("=")
        if flag in SWITCHES and not equals:
            i += 1
        elif flag in VALUED_FLAGS:
            if not equals and (i + 1 >= len(args) or args[i + 1].startswith("--")):
                return f"engine argument {arg!r} needs a value"
            i += 1 if equals else 2
        else:
            return (f"engine argument {arg!r} is not one a deployment may set (ModelGrid sets the model, names, "
                    "address, key, memory and LoRA itself; see docs/engines.md for the flags taken)")
    return None
