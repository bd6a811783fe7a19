# syntax=docker/dockerfile:1
# stepscope exporter image: a slim Python base, no CUDA. The NVIDIA container toolkit
# injects libnvidia-ml.so and /dev/nvidia* at start (NVIDIA_VISIBLE_DEVICES=all), so the
# image stays small and works with whatever driver the node runs.
#
#   docker build -t stepscope .
#   docker run --rm --runtime nvidia -p 9400:9400 -v /run/stepscope:/run/stepscope stepscope
#   docker run --rm -p 9400:9400 stepscope serve --simulate 4     # anywhere, no GPU

# Pinned to an exact release; both stages must use the same Python (the venv links to it).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: install the package and its runtime dependencies into a venv
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/stepscope
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter/ exporter/
# Not editable, no test extra. auth: bcrypt for basic auth in --web-config; aws: botocore
# for stepscope_node_info (IMDSv2) and boto3 for `stepscope discover`. Both optional:
# --build-arg EXTRAS= builds the smallest image, which serves without them.
ARG EXTRAS="auth,aws"
RUN /opt/stepscope/bin/pip install --no-compile ".${EXTRAS:+[$EXTRAS]}" \
    && /opt/stepscope/bin/python -m compileall -q /opt/stepscope/lib

# ---- runtime: the venv and nothing else
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 stepscope \
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
ENTRYPOINT ["stepscope"]
CMD ["serve"]
