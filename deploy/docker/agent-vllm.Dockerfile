# The agent with vLLM's CUDA build in a virtual environment of its own (/opt/vllm: its pins differ from the agent's),
# which the vllm engine runs (MODELGRID_VLLM_PYTHON). Build the agent image first, then from the repository root:
#   docker build -f deploy/docker/agent-vllm.Dockerfile --build-arg AGENT_IMAGE=modelgrid/agent:dev \
#       -t modelgrid/agent-vllm:dev .
ARG AGENT_IMAGE=modelgrid/agent:dev
FROM ${AGENT_IMAGE}
ARG VLLM_PACKAGE=vllm==0.32.0
USER 0:0
# Triton, under vLLM, compiles its kernel launchers when they are first used: a C compiler and Python's headers.
# hadolint ignore=DL3041
RUN dnf install -y --setopt=install_weak_deps=False gcc python3.11-devel \
    && dnf clean all \
    && python3.11 -m venv /opt/vllm \
    && /opt/vllm/bin/pip install --no-cache-dir --disable-pip-version-check "$VLLM_PACKAGE" torch==2.13.0 \
    && find /opt/vllm -name __pycache__ -prune -exec rm -rf {} +
ENV MODELGRID_VLLM_PYTHON=/opt/vllm/bin/python
USER 10001:10001
