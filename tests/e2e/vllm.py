"""What the end-to-end tests of the vllm engine share: its environment, their marks and bounds, and how they see a
deployment serve. vLLM's CPU build comes from `make vllm`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from openai import OpenAI

VLLM_PYTHON = os.environ.get("MODELGRID_VLLM_PYTHON", "")
needs_vllm = [
    pytest.mark.skipif(not (VLLM_PYTHON and Path(VLLM_PYTHON).exists()),
                       reason="no vLLM environment (make vllm, then MODELGRID_VLLM_PYTHON=.venv-vllm/bin/python)"),
    pytest.mark.timeout(900),  # each test may wait out a vLLM start or three on a loaded machine
    pytest.mark.long,
]
START_S = 600  # vLLM's start on a loaded 2-core machine: a bound on what must happen, not a speed
# A tool-call parser, and JSON without free whitespace (else random weights may pad an object until max_tokens).
FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
         "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
GATEWAY_ENV = {"MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS": str(START_S)}  # requests wait out a cold vLLM start


def serving(api, name, fail_fast=True):
    """Its replica once it serves; AssertionError with vLLM's reason as soon as one fails (it would be retried),
    unless a failure is what the test caused."""
    body = api.get(f"/deployments/{name}").json()
    failed = [r for r in body.get("replicas", []) if r["state"] == "failed"]
    assert not (fail_fast and failed), failed and failed[0]["observed_reason"]
    return body["serving"] == "ready" and body["replicas"][0]


def client(stack) -> OpenAI:
    return OpenAI(base_url=stack.url.rstrip("/") + "/v1", api_key=stack.token, timeout=START_S)
