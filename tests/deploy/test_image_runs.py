"""Builds the console image and the agent image's cpu target with podman and starts them: migrate, an agent token
in a volume, the console as its image runs it, and an agent with simulated GPUs that links to it.

No image registry needs to be in reach: the base is a Debian made with debootstrap (apt's mirror) and imported,
and pip in the builds reaches PyPI as the host does. Slow (minutes, gigabytes): run with MODELGRID_IMAGE_TESTS=1
(`make image-test`); as root, with podman, runc and debootstrap installed (Debian's packages)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/modelgrid-test/debian:bookworm"
CONSOLE = "localhost/modelgrid/console:test"
AGENT = "localhost/modelgrid/agent-cpu:test"
MIRROR = os.environ.get("MODELGRID_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CA_BUNDLE = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("MODELGRID_IMAGE_TESTS") != "1", reason="builds images: MODELGRID_IMAGE_TESTS=1"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman (apt-get install podman runc)"),
    pytest.mark.timeout(3600),
]


def podman(*args: str, timeout: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    # Debian 12's crun refuses hybrid cgroup hierarchies ("cgroups in hybrid mode not supported"); runc runs them.
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    result = subprocess.run(["podman", *runtime, *args], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        output = result.stdout[-4000:] + result.stderr[-4000:]
        pytest.fail(f"podman {' '.join(args)}: exit {result.returncode}\n{output}")
    return result


def ulimits() -> list[str]:
    """Limits a runtime without CAP_SYS_RESOURCE can set: podman's defaults are higher than this process's. (Where
    this was written, nproc above 32768 was refused with EPERM although the hard limit was 96367.)"""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[0], 32768)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def build(dockerfile: str, tag: str, *extra: str) -> None:
    mounts = ["-v", f"{CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"] if CA_BUNDLE.is_file() else []
    podman("build", "--format", "docker", *ulimits(), *mounts, "--build-arg", f"PYTHON_BASE={BASE}", *extra,
           "-f", f"deploy/docker/{dockerfile}", "-t", tag, ".", cwd=ROOT, timeout=2400)


def local_torch(tmp: Path) -> list[str]:
    """Where pip's own find-links hold the CPU torch wheel (machines without the network to PyTorch's index), a
    one-package index of it for the build; elsewhere nothing (the Dockerfile's TORCH_INDEX)."""
    for folder in (os.environ.get("PIP_FIND_LINKS") or "").split():
        wheel = Path(folder) / TORCH_WHEEL
        if wheel.is_file():
            index = tmp / "simple" / "torch"
            index.mkdir(parents=True)
            shutil.copy(wheel, index)
            (index / "index.html").write_text(f'<a href="{TORCH_WHEEL.replace("+", "%2B")}">{TORCH_WHEEL}</a>\n')
            return ["-v", f"{tmp}:/torchindex:ro", "--build-arg", "TORCH_INDEX=file:///torchindex/simple"]
    return []


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    if podman("image", "exists", BASE, check=False).returncode != 0:
        if shutil.which("debootstrap") is None or os.getuid() != 0:
            pytest.skip("the base image is made with debootstrap, as root (apt-get install debootstrap)")
        rootfs = tmp_path_factory.mktemp("rootfs")
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                        "bookworm", str(rootfs), MIRROR], check=True, capture_output=True, timeout=1200)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        podman("import", "-", BASE, stdin=tar.stdout, timeout=600)
        tar.wait()
    build("console.Dockerfile", CONSOLE)
    build("agent.Dockerfile", AGENT, "--target", "cpu", *local_torch(tmp_path_factory.mktemp("torch")))
    needs = [("console", CONSOLE, ["python", "manage.py", "up", "--help"], "--no-migrate"),
             ("agent", AGENT, ["--help"], "--token-file")]
    for what, image, cmd, flag in needs:
        if flag not in podman("run", "--rm", *ulimits(), image, *cmd).stdout:
            pytest.skip(f"the {what} has no {flag} yet (the chart's branch adds it)")
    return CONSOLE, AGENT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except OSError:
        return 0, b""


def post(url: str, token: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=180) as response:  # a completion waits while its model loads
        return json.loads(response.read())


def wait_for(check, what: str, seconds: float = 180):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(1)
    pytest.fail(f"{what} within {seconds:g} s")


@pytest.fixture(scope="module")
def fleet(images):
    console, agent = images
    run = f"mg-test-{uuid.uuid4().hex[:8]}"
    data, tokens, models, port = f"{run}-data", f"{run}-tokens", f"{run}-models", free_port()
    store = ["-v", f"{models}:/models:ro", "-e", "MODELGRID_MODEL_ROOTS=/models", "-e", "MODELGRID_MODEL_STORE=/models"]
    try:
        for volume in (data, tokens, models):
            podman("volume", "create", volume)
        podman("run", "--rm", *ulimits(), "-v", f"{models}:/models", "--entrypoint", "python", agent,
               "-m", "agent", "demo-models", "/models")
        podman("run", "--rm", *ulimits(), "-v", f"{data}:/var/lib/modelgrid", console,
               "python", "manage.py", "migrate", "--noinput")
        podman("run", "--rm", *ulimits(), "-v", f"{data}:/var/lib/modelgrid", "-v", f"{tokens}:/run/modelgrid",
               console, "sh", "-c",
               "umask 077 && python manage.py createagenttoken sim-test > /run/modelgrid/agent-token")
        podman("run", "-d", "--name", f"{run}-console", *ulimits(), "-p", f"127.0.0.1:{port}:8000",
               "-v", f"{data}:/var/lib/modelgrid", *store, console)  # the image's own command
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(f"{url}/readyz")[0] == 200, "the console is ready")
        podman("run", "-d", "--name", f"{run}-agent", *ulimits(), "--network", f"container:{run}-console",
               "-v", f"{tokens}:/run/modelgrid:ro", "-e", "MODELGRID_AGENT_TOKEN_FILE=/run/modelgrid/agent-token",
               "-v", f"{models}:/models:ro",
               agent, "--console", "http://127.0.0.1:8000", "--name", "sim-test", "--gpus", "sim:2x24GiB",
               "--listen", "127.0.0.1:8100")
        yield {"url": url, "console": f"{run}-console", "agent": f"{run}-agent"}
    finally:
        for name in (f"{run}-agent", f"{run}-console"):
            logs = podman("logs", name, check=False)
            print(f"== {name}\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
            podman("rm", "-f", "-v", "-t", "5", name, check=False)  # -v: its anonymous volumes too
        podman("volume", "rm", "-f", data, tokens, models, check=False)


def test_the_images_start_and_the_agent_joins_the_console(fleet):
    token = podman("exec", fleet["console"], "python", "manage.py", "createapitoken", "image-test").stdout.strip()

    def joined():
        status, body = get(f"{fleet['url']}/api/v1/hosts/sim-test", token)
        host = json.loads(body) if status == 200 else {}
        return host if host.get("connected") and len(host.get("gpus", [])) == 2 else None

    host = wait_for(joined, "the agent sim-test joins with two simulated GPUs")
    assert host["state"] == "connected"
    assert {"torch", "llamacpp"} <= set(host["engines"])  # llama.cpp's server loads (its libraries are there)
    for name in (fleet["console"], fleet["agent"]):
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        assert podman("healthcheck", "run", name, check=False).returncode == 0  # the image's HEALTHCHECK
    live = podman("exec", fleet["agent"], "python", "-c", "import urllib.request; print(urllib.request.urlopen("
                  "'http://127.0.0.1:8100/v2/health/live').read().decode())")
    assert json.loads(live.stdout) == {"live": True}
    no_torch = podman("exec", fleet["console"], "python", "-c",
                      "import importlib.util as u; print(u.find_spec('torch'))")
    assert no_torch.stdout.strip() == "None"


def test_the_console_serves_a_model_from_the_agent(fleet):
    token = podman("exec", fleet["console"], "python", "manage.py", "createapitoken", "image-test").stdout.strip()
    wait_for(lambda: get(f"{fleet['url']}/api/v1/hosts/sim-test", token)[0] == 200, "the agent joins")
    post(f"{fleet['url']}/api/v1/models", token, {"name": "tiny-llama", "path": "tiny-llama"})
    post(f"{fleet['url']}/api/v1/deployments", token,
         {"name": "chat", "model": "tiny-llama", "min_replicas": 0, "max_replicas": 1})
    answer = post(f"{fleet['url']}/v1/completions", token, {"model": "chat", "prompt": "Once upon", "max_tokens": 4})
    assert len(answer["choices"]) == 1 and 1 <= answer["usage"]["completion_tokens"] <= 4  # random weights: EOS too
