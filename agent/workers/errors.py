"""What a worker command can fail with, daemon side, and how either side words an error (no torch)."""

from __future__ import annotations

_REASON_LIMIT = 1000


class InferenceError(RuntimeError):
    """The worker could not answer; the message says why."""


class InferenceInputError(InferenceError):
    """The worker refused the inputs (a client error, like a token id outside the vocabulary)."""


class InferenceOutOfMemory(InferenceError):
    """The request needed more memory than the replica's share; the worker refused it and still serves."""


class InferenceTimeout(InferenceError):
    """The worker did not answer in time."""


class WorkerUnavailable(InferenceError):
    """The worker is not ready (starting, loading, asleep, failed, stopped, or it died during the request)."""


ERROR_KINDS: dict[str, type[InferenceError]] = {
    "input": InferenceInputError,
    "oom": InferenceOutOfMemory,
    "timeout": InferenceTimeout,
    "unavailable": WorkerUnavailable,
    "error": InferenceError,
}


def describe_error(error: BaseException) -> str:
    """One line a person can act on: the exception type and its message, bounded in length."""
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"
