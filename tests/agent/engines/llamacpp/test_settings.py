"""What a deployment may add to llama-server's command line (settings.py), checked by the shared parser."""

import pytest

from agent.engines.llamacpp import LlamacppEngine

ENGINE = LlamacppEngine()


def test_it_takes_bounded_serving_flags():
    settings = ENGINE.parse_settings(["--ctx-size", "4096", "--parallel=4", "--threads", "2", "--cache-type-k",
                                      "q8_0", "--flash-attn", "auto", "--no-context-shift", "--temp", "0.7"])
    assert settings.values == {"--ctx-size": 4096, "--parallel": 4, "--threads": 2, "--cache-type-k": "q8_0",
                               "--flash-attn": "auto", "--no-context-shift": True, "--temp": 0.7}


@pytest.mark.parametrize(("args", "why"), [
    (["--ctx-size", "0"], "takes an integer from 16 to 1,048,576"),
    (["--parallel", "-1"], "needs a value"),
    (["--cache-type-k", "q2_k"], "takes one of f32, f16"),
    (["--context-shift", "--no-context-shift"], "given twice (or with its opposite)"),
    (["--model", "/etc/passwd"], "ModelGrid sets it"),
    (["--api-key", "x"], "ModelGrid sets it"),
    (["--port", "80"], "ModelGrid sets it"),
    (["--chat-template-file", "/tmp/t.jinja"], "reads or writes files on the host"),
    (["--slot-save-path", "/tmp"], "reads or writes files on the host"),
    (["--tools", "all"], "runs tools or proxies requests"),
    (["--agent"], "runs tools or proxies requests"),
    (["--hf-repo", "a/b"], "downloads from the network"),
    (["-c", "512"], "is not one a deployment may set"),
])
def test_it_refuses_what_is_not_listed_or_out_of_bounds_saying_why(args, why):
    assert why in ENGINE.settings_problem(args)
