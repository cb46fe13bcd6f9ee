# syntax=docker/dockerfile:1
# The image every manifest in k8s/ names: the hptransfer project, its `hpt` CLI and the Ray,
# MLflow and DeepSpeed it drives. One Dockerfile, two variants:
#   CPU (k8s/overlays/cpu-dev):
#     docker build -t ghcr.io/hptransfer/hptransfer:0.1.0-cpu .
#   CUDA (k8s/overlays/gpu-prod):
#     docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#       -t ghcr.io/hptransfer/hptransfer:0.1.0-cuda .
# Pods run it as uid 1000 with a read-only root filesystem; /tmp is an emptyDir there.
FROM python:3.11-slim

# Where torch comes from decides CPU or CUDA; the version stays the one constraints.txt pins
# (`torch==2.13.0` also matches the local builds 2.13.0+cpu / 2.13.0+cu128).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    RAY_USAGE_STATS_ENABLED=0 \
    HF_HUB_OFFLINE=1

# g++: DeepSpeed JIT-compiles its ops (shm comm, cpu_adam) on first use. tini: PID 1 that reaps
# the processes Ray and MLflow fork.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 hpt \
 && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/hpt --shell /usr/sbin/nologin hpt \
 && python -m venv /opt/venv

WORKDIR /app

# Dependencies first (their own layer, reused while only the source changes).
COPY constraints.txt pyproject.toml README.md ./
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==2.13.0"

COPY platform ./platform
# ray[default]: the dashboard and Jobs API a RayJob submits through. psycopg2-binary: the
# PostgreSQL backend store gpu-prod's MLflow uses. mup declares torchvision but never imports
# it, and a torchvision that does not match torch breaks `import transformers`: remove it.
RUN pip install -c constraints.txt . "ray[default]" psycopg2-binary \
 && pip uninstall -y torchvision \
 && python -c "import platform, hptransfer, ray, mlflow; platform.system()"

COPY search_spaces ./search_spaces
COPY launchers ./launchers

USER 1000:1000
ENV HOME=/home/hpt
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["hpt", "--help"]
