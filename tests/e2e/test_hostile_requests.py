"""Requests that took down a host's models, against a running `manage.py up`, through the console's gateway with
an inference-only token: sampling settings at the edge of their ranges, a 12 MiB prompt, a tokenizer whose
pre-tokenizer regex backtracks and a chat template that loops. Each is answered alone (the edge settings
sample, the others get a 400 that names what is wrong) while a bystander keeps streaming, and no worker process
changes."""

from __future__ import annotations

import json
import shutil
import threading
import time

import httpx
import pytest

from tests.e2e.stack import wait_for

pytestmark = pytest.mark.e2e
LOOPING_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
DEPLOYMENTS = ("hr-chat", "hr-regex", "hr-loop")


@pytest.fixture(scope="module")
def hostile(stack, tiny_llama):
    """Three deployments of the tiny Llama, ready: as built, with a backtracking tokenizer, with a looping template."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    regex, loop = tiny_llama.parent / "hr-regex", tiny_llama.parent / "hr-loop"
    for path in (regex, loop):
        shutil.copytree(tiny_llama, path, dirs_exist_ok=True)
    tokenizer = Tokenizer.from_file(str(regex / "tokenizer.json"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("(a|aa)+b"), behavior="isolated")
    tokenizer.save(str(regex / "tokenizer.json"))
    config = json.loads((loop / "tokenizer_config.json").read_text())
    (loop / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": LOOPING_TEMPLATE}))
    api = stack.api()
    for name, path in zip(DEPLOYMENTS, (tiny_llama, regex, loop), strict=True):
        assert api.post("/models", json={"name": name, "path": str(path)}).status_code == 201
        assert api.post("/deployments", json={"name": name, "model": name}).status_code == 201
    for name in DEPLOYMENTS:
        wait_for(lambda n=name: stack.worker_pids(n), 180, interval=0.5, what=f"{name} to be ready")
    token = stack.manage("createapitoken", "hostile", "--scope", "inference")
    return {name: stack.worker_pids(name) for name in DEPLOYMENTS}, token


class Bystander(threading.Thread):
    """Streams completions from hr-chat one after another until stopped; the time of every event it receives."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.arrivals, self.failures = url, token, [], []
        self.done = threading.Event()

    def run(self) -> None:
        body = {"model": "hr-chat", "prompt": "the cat", "max_tokens": 48, "stream": True}
        with httpx.Client(base_url=self.url, timeout=120, headers={"Authorization": f"Bearer {self.token}"}) as c:
            while not self.done.is_set():
                with c.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        self.failures.append(response.status_code)
                        continue
                    for line in response.iter_lines():
                        if line.startswith("data: {"):
                            self.arrivals.append(time.monotonic())

    def during(self, began: float, ended: float) -> int:
        return sum(began <= t <= ended for t in self.arrivals)


def test_hostile_requests_fail_alone_while_a_bystander_streams(stack, hostile):
    pids, token = hostile
    bystander = Bystander(stack.url.rstrip("/"), token)
    bystander.start()
    wait_for(lambda: bystander.arrivals, 60, what="the bystander's stream to flow")
    client = httpx.Client(base_url=stack.url.rstrip("/"), timeout=120, headers={"Authorization": f"Bearer {token}"})
    calls = {
        "edge sampling": ("/v1/completions", {"model": "hr-chat", "prompt": "the cat", "max_tokens": 8,
                                              "top_p": 1e-300, "temperature": 1e-40}),
        "12 MiB prompt": ("/v1/completions", {"model": "hr-chat", "prompt": "a" * (12 << 20), "max_tokens": 2}),
        "backtracking tokenizer": ("/v1/completions", {"model": "hr-regex", "prompt": ("a" * 33 + " ") * 40,
                                                       "max_tokens": 2}),
        "looping template": ("/v1/chat/completions", {"model": "hr-loop", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "hi"}]}),
    }
    answers, windows = {}, {}
    try:
        for what, (path, body) in calls.items():
            began = time.monotonic()
            answers[what] = client.post(path, json=body)
            windows[what] = (began, time.monotonic())
            print(f"{what}: {answers[what].status_code} in {windows[what][1] - began:.2f} s")
            time.sleep(0.3)  # the bystander's next events, before the next call
    finally:
        bystander.done.set()
        bystander.join(120)
        client.close()
    assert answers["edge sampling"].status_code == 200
    assert answers["12 MiB prompt"].status_code == 400
    assert "model 'hr-chat' takes at most 256 tokens" in answers["12 MiB prompt"].json()["error"]["message"]
    assert answers["backtracking tokenizer"].status_code == 400
    assert "its tokenizer" in answers["backtracking tokenizer"].json()["error"]["message"]
    assert answers["looping template"].status_code == 400
    assert "its chat template took longer than" in answers["looping template"].json()["error"]["message"]
    assert bystander.failures == []
    # The template runs to the time limit (seconds): the bystander streamed through it. (The regex either runs past
    # the limit too, or passes Oniguruma's retry limit at once and the tokenizer panics: a 400 either way.)
    assert bystander.during(*windows["looping template"])
    began, ended = windows["backtracking tokenizer"]
    assert ended - began < 1 or bystander.during(began, ended)
    assert {name: stack.worker_pids(name) for name in DEPLOYMENTS} == pids  # no worker died or was replaced
