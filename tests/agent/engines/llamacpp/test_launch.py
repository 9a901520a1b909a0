"""A desired replica as llama-server's command line (launch.py, through the engine's command())."""

import pytest

from agent.artifacts import ArtifactError
from agent.engines.llamacpp import LlamacppEngine
from agent.protocol import DesiredReplica

ENGINE = LlamacppEngine()


def _replica(**changes) -> DesiredReplica:
    return DesiredReplica(**({"id": 7, "deployment": "chat", "model_path": "/models/tiny.Q4_0.gguf",
                              "architecture": "llama", "gpus": [], "reserved_bytes": 1 << 30} | changes))


def _flag(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_it_serves_the_file_under_the_deployments_name_on_loopback_with_metrics():
    started = ENGINE.command(_replica(), "cpu", 0)
    args = started.args
    assert (_flag(args, "--model"), _flag(args, "--alias"), _flag(args, "--host")) == ("/models/tiny.Q4_0.gguf",
                                                                                       "chat", "127.0.0.1")
    assert {"--metrics", "--no-webui", "--no-slots", "--jinja", "--offline"} <= set(args)
    # The port and the key are the worker's: the key never on a command line.
    assert "--port" not in args and "--api-key" not in args
    assert not any("KEY" in name for name, _ in started.env)


def test_on_cpu_it_offloads_no_layer_and_sees_no_gpu():
    started = ENGINE.command(_replica(), "cpu", 0, threads=3)
    assert _flag(started.args, "--n-gpu-layers") == "0" and _flag(started.args, "--threads") == "3"
    assert dict(started.env)["CUDA_VISIBLE_DEVICES"] == ""


def test_on_a_gpu_it_offloads_every_layer_to_its_placement():
    started = ENGINE.command(_replica(gpus=[2]), "cuda:2", 0)
    assert _flag(started.args, "--n-gpu-layers") == "999"
    assert dict(started.env)["CUDA_VISIBLE_DEVICES"] == "2"
    assert dict(ENGINE.command(_replica(gpus=[0, 1]), "cuda:0", 0).env)["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_its_context_is_the_replicas_seq_unless_the_deployment_sets_one():
    assert _flag(ENGINE.command(_replica(seq=512), "cpu", 0).args, "--ctx-size") == "512"
    args = ENGINE.command(_replica(seq=512, engine_args=["--ctx-size", "2048", "--threads", "1"]), "cpu", 0,
                          threads=4).args
    assert args.count("--ctx-size") == 1 and _flag(args, "--ctx-size") == "2048"
    assert args.count("--threads") == 1 and _flag(args, "--threads") == "1"


def test_a_flag_it_does_not_take_fails_the_start_saying_why():
    with pytest.raises(ArtifactError, match="'--tools' .* runs tools"):
        ENGINE.command(_replica(engine_args=["--tools", "all"]), "cpu", 0)
