# The agent: one per GPU host. Two targets, built from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t modelgrid/agent:dev .                 (cuda, the default)
#   docker build -f deploy/docker/agent.Dockerfile --target cpu -t modelgrid/agent-cpu:dev .  (simulated GPUs)
# cuda: torch==2.13.0's CUDA build, whose wheels carry CUDA's libraries; the base adds the container runtime's
# settings, and the NVIDIA container runtime injects the driver and NVML (libnvidia-ml) from the host.
# cpu: the CPU build of torch, for `--gpus sim:...` (compose's demo, CI); not for GPU hosts.
ARG CUDA_BASE=nvidia/cuda:13.0.1-base-ubi9
ARG PYTHON_BASE=python:3.11.14-slim-bookworm

FROM ${PYTHON_BASE} AS cpu-build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.txt requirements-console.txt /tmp/
# torch==2.13.0 also matches 2.13.0+cpu, which the CPU index has and which ranks above PyPI's CUDA build.
RUN python3 -m venv /opt/modelgrid \
    && /opt/modelgrid/bin/pip install --extra-index-url "$TORCH_INDEX" -r /tmp/requirements.txt \
    && find /opt/modelgrid -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_BASE} AS cpu
# libgomp: llama.cpp's server (xllamacpp) links OpenMP. Package versions follow the pinned base's repositories.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 modelgrid \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/modelgrid --shell /usr/sbin/nologin modelgrid \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/modelgrid /run/modelgrid \
    && install -d -o 10001 -g 10001 -m 0755 /models
COPY --from=cpu-build /opt/modelgrid /opt/modelgrid
WORKDIR /app
COPY agent agent
ENV PATH=/opt/modelgrid/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    HF_HUB_OFFLINE=1 \
    MODELGRID_DATA_DIR=/var/lib/modelgrid \
    MODELGRID_MODEL_ROOTS=/models
USER 10001:10001
EXPOSE 8100
VOLUME ["/var/lib/modelgrid"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/v2/health/live', timeout=2)"]
ENTRYPOINT ["python", "-m", "agent", "run"]

FROM ${CUDA_BASE} AS cuda-python
# UBI 9 keeps Python 3.11 current (Ubuntu 22.04's python3.11 is a release candidate; 24.04 has 3.12 only).
# libgomp: llama.cpp's server (xllamacpp) links OpenMP. Package versions follow the pinned base's repositories.
# hadolint ignore=DL3041
RUN dnf install -y --setopt=install_weak_deps=False python3.11 libgomp shadow-utils \
    && dnf clean all \
    && groupadd --system --gid 10001 modelgrid \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/modelgrid --shell /sbin/nologin modelgrid \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/modelgrid /run/modelgrid \
    && install -d -o 10001 -g 10001 -m 0755 /models

FROM cuda-python AS cuda-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.txt requirements-console.txt /tmp/
RUN python3.11 -m venv /opt/modelgrid \
    && /opt/modelgrid/bin/pip install -r /tmp/requirements.txt \
    && find /opt/modelgrid -name __pycache__ -prune -exec rm -rf {} +

FROM cuda-python AS cuda
COPY --from=cuda-build /opt/modelgrid /opt/modelgrid
WORKDIR /app
COPY agent agent
ENV PATH=/opt/modelgrid/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    HF_HUB_OFFLINE=1 \
    MODELGRID_DATA_DIR=/var/lib/modelgrid \
    MODELGRID_MODEL_ROOTS=/models
# Non-root: the NVIDIA runtime's device nodes are open to every user (MPS: docs/install.md).
USER 10001:10001
EXPOSE 8100
VOLUME ["/var/lib/modelgrid"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/v2/health/live', timeout=2)"]
ENTRYPOINT ["python", "-m", "agent", "run"]
