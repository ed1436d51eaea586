# syntax=docker/dockerfile:1
#
# One image for every tffleet role: the command picks it (api, worker, flower, migrate, ...).
#
#   docker build -t tffleet .                                         # CPU TensorFlow + Flower
#   docker build -t tffleet-cuda --build-arg EXTRAS=worker-cuda,flower .  # CUDA/cuDNN from pip, for GPUs
#
# GPU containers also need the NVIDIA Container Toolkit on the host (see docker-compose.yml).
# No secret goes into the image: database and Flower credentials come from the environment at run time.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: install the package and its extras into a venv ------------------------------------
FROM ${PYTHON_IMAGE} AS build

# Extras from pyproject.toml: worker (tensorflow) or worker-cuda (tensorflow[and-cuda]); Flower is
# in the base install (the `flower` extra is kept, empty, for older build lines).
ARG EXTRAS=worker,flower

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# A compiler only for dependencies that have no wheel for this platform; it stays in this stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/tffleet \
    && /opt/tffleet/bin/pip install --upgrade pip

WORKDIR /src
COPY pyproject.toml README.md ./
COPY tffleet ./tffleet
COPY api ./api
COPY db ./db
COPY worker ./worker
RUN /opt/tffleet/bin/pip install ".[${EXTRAS}]"

# ---- runtime: the venv, a non-root user, nothing else ------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

RUN groupadd --system --gid 10001 tffleet \
    && useradd --system --uid 10001 --gid tffleet --create-home --home-dir /home/tffleet \
       --shell /usr/sbin/nologin tffleet \
    && mkdir -p /models \
    && chown tffleet:tffleet /models

COPY --from=build /opt/tffleet /opt/tffleet

ENV PATH=/opt/tffleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TFFLEET_API_HOST=0.0.0.0 \
    TFFLEET_API_PORT=8000 \
    TFFLEET_MODEL_REPOSITORY=/models

# Numeric, so that runAsNonRoot-style checks can verify it without /etc/passwd.
USER 10001:10001
WORKDIR /home/tffleet

# 8000: API, 5555: Flower.
EXPOSE 8000 5555

CMD ["tffleet", "api"]
