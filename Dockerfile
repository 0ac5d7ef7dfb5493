# The connector image (the default target: the last stage), the flow image and the Flyte 2 connector image, built
# from this repository:
#
#   docker build -t localhost:30000/ddlscale-connector:latest .
#   docker build --target flow -t localhost:30000/ddlscale-flow:latest .
#   docker build --target flyte2-connector -t localhost:30000/ddlscale-flyte2-connector:latest .
#
# The package is not on a package index: the first stage builds its wheel from the build context, and
# the images install that wheel (and nothing of the source) under constraints.txt, into a virtual
# environment owned by root and run as user 1000, whose home is the working directory (flytekit writes
# there: fast-registered code, its local cache). Python 3.11: constraints.txt resolves on 3.11 and 3.12.
# What each image runs: the connector images their server (`docker run` with no arguments serves on 8000, metrics
# on 9090, as examples/k8s/connector.yaml and flyte2-connector.yaml start them); the flow image no ENTRYPOINT, since
# Flyte starts a task pod with the task's own command as the container's args (`pyflyte-execute ...`), which
# replace any CMD.
# tests/test_connector_image.py runs the RUN steps of the connector targets and starts the Deployment of their
# manifests from what they installed, with the uv this file pins.
FROM python:3.11-slim AS wheel
COPY --from=ghcr.io/astral-sh/uv:0.13.8 /uv /usr/local/bin/uv
COPY . /src
RUN uv build --wheel --out-dir /dist /src

FROM python:3.11-slim AS base
COPY --from=ghcr.io/astral-sh/uv:0.13.8 /uv /usr/local/bin/uv
RUN useradd --create-home --home-dir /home/flyte --uid 1000 --user-group flyte
COPY --from=wheel /dist /dist
COPY constraints.txt /dist/constraints.txt
RUN uv venv --python /usr/local/bin/python3.11 /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# Task pods of flows that use the plugin (container mode): flytekit, the plugin and dask[distributed].
FROM base AS flow
RUN --mount=type=cache,target=/root/.cache/uv uv pip install --python /opt/venv/bin/python -c /dist/constraints.txt "$(ls /dist/*.whl)"
USER 1000:1000
WORKDIR /home/flyte

# Flyte 2's connector server (c0) with the Flyte 2 connector: the flyte2 extra, and the connector extra for the
# prometheus-client c0 imports at start (examples/k8s/flyte2-connector.yaml).
FROM base AS flyte2-connector
RUN --mount=type=cache,target=/root/.cache/uv uv pip install --python /opt/venv/bin/python -c /dist/constraints.txt "$(ls /dist/*.whl)[connector,flyte2]"
USER 1000:1000
WORKDIR /home/flyte
CMD ["c0"]

# The connector service: the connector extra adds the gRPC health service and Prometheus metrics.
FROM base AS connector
RUN --mount=type=cache,target=/root/.cache/uv uv pip install --python /opt/venv/bin/python -c /dist/constraints.txt "$(ls /dist/*.whl)[connector]"
USER 1000:1000
WORKDIR /home/flyte
CMD ["pyflyte", "serve", "connector"]
