"""What a worker command can fail with, daemon side (no torch); each message says why."""

from __future__ import annotations


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
