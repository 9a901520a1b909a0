# The console: Django + Channels, the scheduler and the inference gateway. No torch: it installs
# requirements-console.txt only. Build from the repository root:
#   docker build -f deploy/docker/console.Dockerfile -t modelgrid/console:dev .
# Migrations are a separate step (`python manage.py migrate --noinput`), never run by the serving processes.
ARG PYTHON_BASE=python:3.11.14-slim-bookworm

FROM ${PYTHON_BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements-console.txt /tmp/
RUN python3 -m venv /opt/modelgrid \
    && /opt/modelgrid/bin/pip install -r /tmp/requirements-console.txt \
    && find /opt/modelgrid -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_BASE} AS console
# One fixed uid/gid (10001) that orchestrators can name in their security contexts.
RUN groupadd --system --gid 10001 modelgrid \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/modelgrid --shell /usr/sbin/nologin modelgrid \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/modelgrid /run/modelgrid
COPY --from=build /opt/modelgrid /opt/modelgrid
WORKDIR /app
COPY manage.py ./
COPY console console
COPY agent agent
COPY templates templates
COPY static static
ENV PATH=/opt/modelgrid/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODELGRID_DATA_DIR=/var/lib/modelgrid
USER 10001:10001
EXPOSE 8000
VOLUME ["/var/lib/modelgrid"]
# /livez: the console's event loop answers (console/probes.py); /readyz adds its database.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=2)"]
CMD ["python", "manage.py", "up", "--no-agent", "--no-migrate", "--host", "0.0.0.0", "--port", "8000"]
