# elastic-ctr images, one target per role, built from the repository root (the context;
# see .dockerignore), as the Pulumi Images component builds them:
#   docker build --target trainer -t elastic-ctr-trainer .   # data generate, train (Paddle)
#   docker build --target cube    -t elastic-ctr-cube .      # cube build|server|agent|transfer, fileserver
#   docker build --target serving -t elastic-ctr-serving .   # serve, client (ONNX Runtime, no Paddle)
#   docker build --target serving-paddle -t elastic-ctr-serving-paddle .  # serving with Paddle Inference too
#   docker build --target tracking -t elastic-ctr-tracking . # mlflow server (the stack's TrackingServer)
# The trainer and cube images get MLflow's client only (mlflow-skinny, requirements/tracking.txt);
# the full server (pandas, pyarrow, SQLAlchemy...) only goes into the tracking image.
# Each installs the project with its role's extra (pyproject.toml), at the exact versions
# the tests ran with (requirements/constraints.txt); the entrypoint is the `elastic-ctr`
# console script, run as the non-root user 10001.
# PYTHON_IMAGE: an official Python slim image by default; `make images` passes a base built
# from the machine's own Debian packages where no registry can be reached.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---------------------------------------------------------------- build stages
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# a C compiler for the cube kernel (runtime/cube/kernel.c, built with the project)
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements/ requirements/

# dependencies first, in layers of their own shared by the roles (a code change reinstalls no
# dependency; Paddle is installed and byte-compiled once for the trainer and serving-paddle)
FROM builder AS deps-common
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install -r requirements/base.txt -r requirements/s3.txt -c requirements/constraints.txt \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM deps-common AS deps-paddle
RUN /opt/venv/bin/pip install -r requirements/paddle.txt -c requirements/constraints.txt \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM deps-paddle AS build-trainer
RUN /opt/venv/bin/pip install -r requirements/tracking.txt -r requirements/paddle2onnx.txt \
       -r requirements/onnxruntime.txt -c requirements/constraints.txt
COPY pyproject.toml setup.py README.md ./
COPY runtime/ runtime/
RUN /opt/venv/bin/pip install ".[trainer,s3]" -c requirements/constraints.txt \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM deps-common AS build-cube
RUN /opt/venv/bin/pip install -r requirements/cube.txt -r requirements/tracking.txt -c requirements/constraints.txt
COPY pyproject.toml setup.py README.md ./
COPY runtime/ runtime/
RUN /opt/venv/bin/pip install ".[cube,s3]" -c requirements/constraints.txt \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

# serving runs the dense network on ONNX Runtime: no Paddle (runtime/dense_backends.py)
FROM deps-common AS build-serving
RUN /opt/venv/bin/pip install -r requirements/serving.txt -r requirements/onnxruntime.txt -c requirements/constraints.txt
COPY pyproject.toml setup.py README.md ./
COPY runtime/ runtime/
RUN /opt/venv/bin/pip install ".[serving,s3]" -c requirements/constraints.txt \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

# serving with Paddle Inference as well: the dense backend paddle, and versions without model.onnx
FROM deps-paddle AS build-serving-paddle
RUN /opt/venv/bin/pip install -r requirements/serving.txt -r requirements/onnxruntime.txt -c requirements/constraints.txt
COPY pyproject.toml setup.py README.md ./
COPY runtime/ runtime/
RUN /opt/venv/bin/pip install ".[serving,paddle,s3]" -c requirements/constraints.txt \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM builder AS build-tracking
# the MLflow server alone (not this project): its entrypoint is `mlflow`
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install -r requirements/tracking-server.txt -c requirements/constraints.txt \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

# ---------------------------------------------------------------- runtime stages
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin app \
 && install -d -o 10001 -g 10001 /work
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
WORKDIR /work
ENTRYPOINT ["elastic-ctr"]
CMD ["--help"]

FROM runtime AS paddle-runtime
# Paddle's CPU wheel links against the GNU OpenMP runtime
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*

FROM runtime AS cube
COPY --from=build-cube /opt/venv /opt/venv
USER 10001:10001
# the code's version, for the MLflow runs (runtime/tracking.py); last: a new commit changes this layer only
ARG GIT_COMMIT=""
ENV ELASTIC_CTR_GIT_COMMIT=$GIT_COMMIT

FROM runtime AS serving
COPY --from=build-serving /opt/venv /opt/venv
USER 10001:10001

FROM paddle-runtime AS serving-paddle
COPY --from=build-serving-paddle /opt/venv /opt/venv
USER 10001:10001

FROM paddle-runtime AS trainer
COPY --from=build-trainer /opt/venv /opt/venv
USER 10001:10001
ARG GIT_COMMIT=""
ENV ELASTIC_CTR_GIT_COMMIT=$GIT_COMMIT

FROM runtime AS tracking
COPY --from=build-tracking /opt/venv /opt/venv
USER 10001:10001
ENTRYPOINT ["mlflow"]
CMD ["server", "--help"]
