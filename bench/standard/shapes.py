"""The standard shapes: what each sends, sized for a model of 256 positions (prompt and output fit in it), and
how long each runs. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

GUIDELLM = "guidellm"
DRIVER = "driver"  # bench/standard/driver.py: GuideLLM 0.8.1 sends one model name per run and times no cold start


@dataclass(frozen=True)
class Shape:
    """One traffic shape. `data` is GuideLLM's synthetic_text configuration for the shapes it runs."""

    name: str
    what: str
    tool: str
    streams: int = 8
    prompt_tokens: int = 0
    output_tokens: int = 0
    data: dict = field(default_factory=dict)
    request_format: str = "/v1/completions"


SHAPES: tuple[Shape, ...] = (
    Shape("fixed 128/64", "synthetic prompts of 128 tokens, 64 out", GUIDELLM, prompt_tokens=128, output_tokens=64,
          data={"prompt_tokens": 128, "output_tokens": 64}),
    Shape("shared prefix", "32-token prompts after a shared prefix: half of them one of 2 prefixes of 96 tokens, "
          "half one of 8 of 48; 32 out", GUIDELLM, prompt_tokens=32, output_tokens=32,
          data={"prompt_tokens": 32, "output_tokens": 32, "prefix_buckets": [
              {"bucket_weight": 50, "prefix_count": 2, "prefix_tokens": 96},
              {"bucket_weight": 50, "prefix_count": 8, "prefix_tokens": 48}]}),
    Shape("multi-turn x3", "chats of 3 turns, each 32 tokens more and 24 out, the history resent",
          GUIDELLM, streams=4, prompt_tokens=32, output_tokens=24,
          data={"prompt_tokens": 32, "output_tokens": 24, "turns": 3}, request_format="/v1/chat/completions"),
    Shape("LoRA split", "64-token prompts, 32 out, split 50/50 over 2 adapters of one base", DRIVER,
          prompt_tokens=64, output_tokens=32),
    Shape("scale from zero", "one streamed request to a deployment with no replica (min_replicas 0): TTFT "
          "includes the load", DRIVER, streams=1, prompt_tokens=16, output_tokens=8),
)

COLD = "scale from zero"


def seconds_per_shape(quick: bool) -> float:
    """How long each loaded shape runs per target: a smoke-sized run with --quick, figures without."""
    return 10.0 if quick else 30.0


def scenario(shape: Shape, *, target: str, model: str, api_key: str, tokenizer: str, seconds: float) -> dict:
    """GuideLLM's scenario file for one shape against one OpenAI-style server (the key travels in this file,
    never on a command line)."""
    if shape.tool != GUIDELLM:
        raise ValueError(f"{shape.name} is driven by bench/standard/driver.py, not GuideLLM")
    return {"spec": {
        "backend": {"kind": "openai_http", "target": target, "model": model, "api_key": api_key,
                    "request_format": shape.request_format},
        "profile": {"kind": "concurrent", "streams": shape.streams},
        "constraints": [{"kind": "max_duration", "seconds": seconds}],
        "tokenizer": {"kind": "hf_auto", "model": tokenizer},
        "data": [{"kind": "synthetic_text"} | shape.data],
    }}
