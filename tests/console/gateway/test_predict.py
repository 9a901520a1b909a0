"""The time-to-first-token predictor (pure): it learns a replica's speed from what it measures, and says its error."""

from __future__ import annotations

import random

from console.gateway.predict import Features, Predictor


def _truth(f: Features) -> float:
    return 0.02 + 0.3 * f.uncached_kb + 0.08 * f.in_flight


def test_it_learns_what_prefill_and_load_cost_and_its_error_falls():
    rng, predictor = random.Random(7), Predictor()
    first = []
    for i in range(400):
        f = Features(rng.uniform(0, 8), rng.randrange(0, 16))
        actual = _truth(f) * rng.uniform(0.95, 1.05)
        predictor.learn("chat", True, f, predictor.predict("chat", True, f), actual)
        if i == 0:
            first = predictor.mape("chat")  # the prior's error
    assert predictor.mape("chat") < 0.05 < first
    assert abs(predictor.predict("chat", True, Features(4, 2)) - _truth(Features(4, 2))) < 0.1


def test_more_uncached_prompt_or_more_load_never_predicts_sooner():
    predictor = Predictor()
    for _ in range(50):  # noisy measurements with no relation to the prompt: a fitted slope may go negative
        predictor.learn("chat", True, Features(8, 0), 0.1, 0.05)
        predictor.learn("chat", True, Features(0, 0), 0.1, 0.1)
    assert predictor.predict("chat", True, Features(8, 4)) >= predictor.predict("chat", True, Features(0, 0))


def test_models_are_kept_per_deployment_and_streaming_and_forgotten_with_the_deployment():
    predictor = Predictor()
    slow = Features(1, 1, 0.1)
    for _ in range(30):
        predictor.learn("chat", False, slow, 1.0, 5.0)
    assert predictor.predict("chat", False, slow) > 4 > predictor.predict("chat", True, slow)
    assert predictor.mape("other") is None
    predictor.forget({"other"})
    assert predictor.mape("chat") is None and predictor.predict("chat", False, slow) < 4


def test_a_feature_that_never_varies_neither_overflows_nor_spoils_the_rest():
    rng, predictor = random.Random(3), Predictor()
    for _ in range(40_000):  # streams: generate_k and the backlog stay 0
        f = Features(rng.uniform(0, 8), rng.randrange(0, 16))
        predictor.learn("chat", True, f, predictor.predict("chat", True, f), _truth(f))
    assert predictor.mape("chat") < 0.05
    assert abs(predictor.predict("chat", True, Features(4, 2)) - _truth(Features(4, 2))) < 0.05
