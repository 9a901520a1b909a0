"""A desired replica as llama-server's command line and environment (daemon side, pure). The worker adds the port
and the key (server.py): the key goes in its environment (LLAMA_API_KEY), never on its command line."""

from __future__ import annotations

from agent.artifacts import ArtifactError
from agent.engines.base import Launch
from agent.engines.llamacpp.settings import ALLOWLIST
from agent.protocol import DesiredReplica
from agent.protocol.engine_args import EngineArgsError, parse_engine_args

ALL_LAYERS = "999"  # --n-gpu-layers past any model's count: every layer on the GPU


def launch(replica: DesiredReplica, device: str, threads: int | None = None) -> Launch:
    """llama-server's arguments for `replica` on `device` ("cpu" or "cuda:N"): its GGUF file under the deployment's
    name on loopback, with /metrics, without its web UI and slot endpoints; its context from the replica's `seq`
    unless the deployment sets --ctx-size; every layer on the GPU of a CUDA placement, none on CPU. ArtifactError
    when the deployment's flags are not taken."""
    try:
        settings = parse_engine_args(list(replica.engine_args), ALLOWLIST, gpus=len(replica.gpus) or None)
    except EngineArgsError as e:
        raise ArtifactError(str(e)) from None
    args = ["--model", replica.model_path, "--alias", replica.deployment, "--host", "127.0.0.1",
            "--no-webui", "--no-slots", "--metrics", "--jinja", "--offline", "--log-colors", "off"]
    env: dict[str, str] = {}
    if replica.seq and "--ctx-size" not in settings.values:
        args += ["--ctx-size", str(replica.seq)]
    if threads and "--threads" not in settings.values:
        args += ["--threads", str(threads)]
    if device == "cpu":
        args += ["--n-gpu-layers", "0"]
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CUDA build of it would otherwise take a GPU it was not placed on
    else:
        # Every GPU of its placement: llama.cpp splits the layers across them.
        spans = [str(g) for g in replica.gpus] if len(replica.gpus) > 1 else [device.partition(":")[2] or "0"]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spans)
        args += ["--n-gpu-layers", ALL_LAYERS]
    args += replica.engine_args
    return Launch(tuple(args), tuple(sorted(env.items())))
