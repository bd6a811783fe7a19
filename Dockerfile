# syntax=docker/dockerfile:1
# stepscope exporter image: a slim Python base, no CUDA. The NVIDIA container toolkit
# injects libnvidia-ml.so and /dev/nvidia* at start (NVIDIA_VISIBLE_DEVICES=all), so the
# image stays small and works with whatever driver the node runs.
#
#   docker build -t stepscope .     # or buildah bud --format docker (keeps the HEALTHCHECK)
#   docker run --rm --runtime nvidia -p 9400:9400 -v /run/stepscope:/run/stepscope stepscope
#   docker run --rm -p 9400:9400 stepscope serve --simulate 4     # anywhere, no GPU
#
# Offline, with no registry and no package index at build time: the base is an image
# already on this machine with Python 3.11 (PYTHON_IMAGE), and the packages come from a
# wheelhouse in the build context (WHEELHOUSE), made beforehand where PyPI is reachable by
# the script that makes the ParallelCluster release (same wheels as the nodes install):
#   deploy/parallelcluster/build-wheelhouse.sh --extras auth,kubernetes dist/release 3.11
# then one of (BASE: a local image with python3 3.11 and python3-venv, e.g. a saved
# python:3.11-slim-bookworm loaded with `docker load`):
#   buildah bud --format docker --pull=never --build-arg PYTHON_IMAGE=BASE --build-arg WHEELHOUSE=dist/release/wheelhouse -t stepscope .
#   podman build --format docker --pull=never --build-arg PYTHON_IMAGE=BASE --build-arg WHEELHOUSE=dist/release/wheelhouse -t stepscope .
#   docker build --pull=false --build-arg PYTHON_IMAGE=BASE --build-arg WHEELHOUSE=dist/release/wheelhouse -t stepscope .
# tests/deploy/test_image.py runs the buildah line as written (BASE: a Debian bookworm
# root it makes with mmdebstrap) and runs the image. Building and pushing for the chart:
# docs/deploy/eks.md.

# Pinned by digest, so every build starts from the same bytes whatever the tag points at
# later; the tag is kept for people. Both stages must use the same Python (the venv links
# to it). Digest of the multi-platform index (docker-library/repo-info). Fully qualified:
# buildah and podman resolve a short name through each machine's registries.conf.
ARG PYTHON_IMAGE=docker.io/library/python:3.11.16-slim-bookworm@sha256:c425d915a89a6dcd3183b1797ad9bd8878caff5a417f6371c8df93c8ea8b727f

# ---- build: install the package and its runtime dependencies into a venv
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/stepscope
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY exporter/ exporter/
# Not editable, no test extra. auth: bcrypt for basic auth in --web-config. kubernetes:
# grpcio and protobuf for pod attribution (the chart turns it on). Node info
# (IMDSv2) needs no AWS SDK; `stepscope discover` (boto3, the aws extra) runs where
# Prometheus is, not on the GPU node: --build-arg EXTRAS=auth,aws adds it.
ARG EXTRAS="auth,kubernetes"
# A directory of the build context holding the wheels (build-wheelhouse.sh's OUT/wheelhouse,
# built with the same EXTRAS): the stepscope wheel and its dependencies come from it, no
# index is asked. Empty: this source, with its dependencies from PyPI. Either way it stays
# in this stage: the runtime image has the venv only.
ARG WHEELHOUSE=""
COPY ${WHEELHOUSE:-LICENSE} /wheelhouse/
# Then the venv's own pip and setuptools go: nothing in the image installs packages.
RUN if [ -n "$WHEELHOUSE" ]; then \
        set -- --no-index --find-links /wheelhouse "stepscope${EXTRAS:+[$EXTRAS]}"; \
    else \
        set -- ".${EXTRAS:+[$EXTRAS]}"; \
    fi \
    && /opt/stepscope/bin/pip install --no-compile "$@" \
    && /opt/stepscope/bin/python -m pip uninstall -q -y pip setuptools \
    && /opt/stepscope/bin/python -m compileall -q /opt/stepscope/lib

# ---- runtime: the venv, the interpreter, nothing to install packages with
FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
# The package's version (stepscope.__version__), written here by python -m generate.
ARG VERSION=0.1.0
ARG REVISION=""
LABEL org.opencontainers.image.title="stepscope" \
      org.opencontainers.image.description="Per-node Prometheus exporter for distributed deep-learning training: DCGM-compatible GPU metrics, step-time breakdown, bottleneck verdicts" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.url="https://github.com/stepscope/stepscope" \
      org.opencontainers.image.source="https://github.com/stepscope/stepscope" \
      org.opencontainers.image.documentation="https://github.com/stepscope/stepscope/tree/main/docs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# The base image's pip, setuptools and wheel are not needed to run, and their advisories
# would be ours: removed, with the user and the socket directory, in one layer.
RUN rm -rf /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/bin/wheel \
       /usr/local/lib/python3.11/site-packages/pip \
       /usr/local/lib/python3.11/site-packages/pip-* \
       /usr/local/lib/python3.11/site-packages/setuptools \
       /usr/local/lib/python3.11/site-packages/setuptools-* \
       /usr/local/lib/python3.11/site-packages/_distutils_hack \
       /usr/local/lib/python3.11/site-packages/distutils-precedence.pth \
       /usr/local/lib/python3.11/site-packages/pkg_resources \
       /usr/local/lib/python3.11/site-packages/wheel \
       /usr/local/lib/python3.11/site-packages/wheel-* \
    && groupadd --system --gid 10001 stepscope \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin stepscope \
    && install -d -o 10001 -g 10001 -m 0755 /run/stepscope
COPY --from=build /opt/stepscope /opt/stepscope
ENV PATH=/opt/stepscope/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 9400
# For Docker and Compose (Kubernetes ignores it and uses the chart's probes; images built
# in OCI format drop it). Follows STEPSCOPE_LISTEN and the config file, not --listen.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-m", "stepscope.app.healthcheck"]
ENTRYPOINT ["stepscope"]
CMD ["serve"]
