# syntax=docker/dockerfile:1
# stargate-router image: wheels are built in the first stage, the runtime stage installs
# only those wheels (no compiler, no source tree, no pip cache) and runs as uid 10001.
# Any other non-root uid runs it too (the Rust router's chart uses 1000, a read-only root
# filesystem and no writable /tmp): the install is root-owned and world-readable, and the
# router writes no file. Both commands are on PATH in /usr/local/bin: `stargate-router` and
# `stargate-k8s-router` (the Rust router's name, which its chart runs).
# .ci/image-smoke.sh proves the same build-wheels / install-wheels-only path without a
# container engine, and runs it as uid 1000 with the install, / and /tmp read-only.

FROM python:3.11-slim AS wheels
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A C compiler (and OpenSSL's headers) for the optional C extensions: the splice of QUIC flows
# (router/udp/_splice.c), the opening of their first Initial (quic/_initial_protection.c,
# against libcrypto, which the runtime image has for Python's ssl) and the TCP relay's pump
# (router/tcp/_relay.c). Only this stage has them.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# .dockerignore admits only what the wheel needs (pyproject.toml, setup.py, README.md, the packages).
COPY . .
RUN pip wheel -w /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Bytecode is compiled at install time, so nothing is written under a read-only root.
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels stargate-router \
    && groupadd --system --gid 10001 stargate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin stargate
USER 10001:10001
WORKDIR /
EXPOSE 50071/tcp 50072/udp 8080/tcp
ENTRYPOINT ["stargate-router"]
