# The image for Docker and Kubernetes work pools (docs/pipeline.md, "Scale out"): the project folder (flows,
# deployments/ and prefect.yaml live next to the package) with the local sandbox's system packages.
# BASE: another Python 3.11 image, e.g. one imported from a debootstrap root where no registry can be reached.
ARG BASE=python:3.11-slim
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap git ca-certificates slirp4netns iproute2 libseccomp2 \
       e2fsprogs util-linux \
    && rm -rf /var/lib/apt/lists/*
COPY . /opt/bugsweep
RUN pip install --no-cache-dir -e /opt/bugsweep
WORKDIR /opt/bugsweep
ENV DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
