"""The interface the worker loop drives, so that other engines can sit beside today's (torch-free).

An engine is one loaded replica: `agent.workers.runtime.LoadedModel` (transformers on CPU or CUDA) is the
only one so far. The worker process (agent.workers.process) loads it, reports `describe()` and
`measure()`, runs its named `commands` between generation steps, and drives its `batcher` for
generations. Another engine (vLLM, TensorRT-LLM, llama.cpp) would implement these two protocols and be
chosen by the spec; nothing in the agent's daemon would change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from agent.workers.generation_spec import EngineStats, GenerationRequest


class StepResult(Protocol):
    """What one generation step produced (agent.workers.continuous.StepOutput)."""

    tokens: list  # agent.workers.generation_spec.Token, to stream
    finished: list  # (request id, GenerationResult)
    failed: list  # agent.workers.continuous.Failure: request_id, text, kind


class GenerationEngine(Protocol):
    """Continuous generation: sequences submitted and cancelled between steps, each step streamed out."""

    @property
    def busy(self) -> bool: ...

    def submit(self, request_id: int, request: GenerationRequest) -> None:
        """Queue a sequence; a ValueError subclass (PromptError, InputError) when it cannot be taken."""

    def cancel(self, request_id: int) -> bool:
        """Drop a sequence at once; False when it is not there."""

    def abort(self, text: str, kind: str) -> list:
        """End every sequence with this error (the replica is going to sleep)."""

    def phases(self) -> Iterator[StepResult]:
        """One step, in parts handed out as each is done (for the continuous batcher: prefill, then decode)."""

    def stats(self) -> EngineStats: ...


class Engine(Protocol):
    """One loaded replica as the worker loop sees it."""

    device: Any  # where it runs, for messages ("cpu", "cuda:0")
    # Named commands the agent may call, each run between two generation steps: "infer" (a forward over
    # a batch of token ids), "infer_mixed" (with an adapter per row), "adapters", "adapter_stats",
    # "sleep", "wake".
    commands: dict[str, Callable[[Any], Any]]

    @property
    def asleep(self) -> bool: ...

    @property
    def batcher(self) -> GenerationEngine | None:
        """The generation engine (None: the model does not generate, e.g. an encoder)."""

    def describe(self) -> dict[str, int]:
        """Facts for model metadata: output_dim, vocab_size, max_positions."""

    def measure(self) -> dict[str, Any]:
        """Warm up and measure what the replica takes (agent.protocol.Measurement fields)."""

    def recover_from_oom(self) -> None:
        """Free what a failed allocation left, so the next request can run."""

    def after_reply(self, kind: str) -> None:
        """Tidy up after a command's answer was sent (e.g. return freed device memory after a sleep; after a wake,
        release the page-locked host copy). The worker runs it after every command, before the next."""
