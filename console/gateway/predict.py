"""Predicted time to first token: for each deployment, a linear model of how long a replica takes to answer's first
byte from what the gateway knows when it sends a request there, learned online from what it then measures.

Features: a constant, the prompt's kilobytes the replica has not cached (its body's bytes less the leading blocks the
prefix index says it holds), the requests already in flight on the replica, (answers not streamed, whose first byte
is their last) the thousands of tokens it may generate, and the replica's prefill backlog: the uncached kilobytes of
the requests sent to it that have not had their first byte yet. Weights come from recursive least squares with
forgetting, weighted for relative error (what MAPE counts: a 50 ms answer predicted at 150 ms is as wrong as a 5 s one
at 15 s), so they follow a replica's speed as load and prompts change; until they have seen a few requests, a prior
stands in. Each prediction's error against what happened is kept per deployment (MAPE, over a window).

Pure: no clock, no I/O; the gateway passes features in and measured seconds back.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

FORGET = 0.98  # weight of the past per observation: about the last 50 requests shape the model
START_P = 100.0  # initial covariance: the first observations move the weights a lot
ERRORS_KEPT = 256  # a deployment's MAPE is over its last this many predictions
# Seconds: fixed cost, per uncached prompt KiB, per request already in flight, per 1,000 tokens generated (unstreamed),
# per KiB of prefill backlog.
PRIOR = (0.05, 0.05, 0.05, 20.0, 0.05)
N = len(PRIOR)
FLOOR_S = 0.001  # no prediction is below this (a fitted intercept may go negative)


class Features(NamedTuple):
    uncached_kb: float
    in_flight: int
    generate_k: float = 0.0  # thousands of tokens to generate before the first byte (0 for a stream)
    backlog_kb: float = 0.0  # uncached KiB sent to the replica before it and still before their first byte

    def vector(self) -> tuple[float, ...]:
        return 1.0, self.uncached_kb, float(self.in_flight), self.generate_k, self.backlog_kb


class _Model:
    """Recursive least squares with forgetting, in plain floats (microseconds a step)."""

    def __init__(self) -> None:
        self.w = list(PRIOR)
        self.p = [[START_P if i == j else 0.0 for j in range(N)] for i in range(N)]

    def predict(self, x: tuple[float, ...]) -> float:
        # Load and uncached tokens never make an answer sooner: a fitted negative slope is noise, not speed.
        w = self.w
        return max(FLOOR_S, w[0] + sum(max(0.0, w[i]) * x[i] for i in range(1, N)))

    def learn(self, x: tuple[float, ...], y: float) -> None:
        """One observation, weighted by 1/y^2: least squares of the relative error (x/y against 1)."""
        x = [v / y for v in x]
        p = self.p
        px = [sum(p[i][j] * x[j] for j in range(N)) for i in range(N)]
        denominator = FORGET + sum(x[i] * px[i] for i in range(N))
        gain = [v / denominator for v in px]
        error = 1.0 - sum(self.w[i] * x[i] for i in range(N))
        self.w = [self.w[i] + gain[i] * error for i in range(N)]
        p = [[(p[i][j] - gain[i] * px[j]) / FORGET for j in range(N)] for i in range(N)]
        # Forgetting inflates the covariance along features that never vary (a stream's generate_k is always 0):
        # capped, or it overflows, and a constant feature's drift eats the precision of the rest.
        trace = sum(p[i][i] for i in range(N))
        if trace > N * START_P:
            p = [[v * N * START_P / trace for v in row] for row in p]
        self.p = p


class Predictor:
    """Models per (deployment, streamed) and prediction errors per deployment."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, bool], _Model] = {}
        self._errors: dict[str, deque[float]] = {}

    def predict(self, deployment: str, streamed: bool, features: Features) -> float:
        model = self._models.get((deployment, streamed))
        return (model or _PRIOR).predict(features.vector())

    def learn(self, deployment: str, streamed: bool, features: Features, predicted: float, actual: float) -> None:
        """What a request sent with `features` took to its first byte (`actual` seconds), against `predicted`."""
        if actual <= 0:
            return
        model = self._models.get((deployment, streamed))
        if model is None:
            model = self._models[deployment, streamed] = _Model()
        model.learn(features.vector(), actual)
        self._errors.setdefault(deployment, deque(maxlen=ERRORS_KEPT)).append(abs(predicted - actual) / actual)

    def mape(self, deployment: str) -> float | None:
        """The mean absolute percentage error of `deployment`'s recent predictions (0.05: 5%); None before any."""
        errors = self._errors.get(deployment)
        return sum(errors) / len(errors) if errors else None

    def forget(self, keep: set[str]) -> None:
        """Drop the models of deployments not in `keep` (deleted)."""
        for key in [k for k in self._models if k[0] not in keep]:
            del self._models[key]
        for name in [n for n in self._errors if n not in keep]:
            del self._errors[name]


_PRIOR = _Model()
