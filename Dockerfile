# One image for GPU and CPU nodes: the launcher + the trainer; the entrypoint is the launcher.
#
# Built with the classic builder (no BuildKit here: no RUN --mount, no heredocs) and without network
# beyond one loopback address: `make image` (docker/build-image.sh) serves ./wheelhouse read-only from a
# throwaway container and runs this build in that container's network namespace, at WHEELS_URL. The
# wheelhouse holds cp311 manylinux wheels of every dependency plus the two local packages (`make
# wheelhouse`). Nothing is COPYed from it, so it never becomes a layer: one stage, and the ~6 GB
# environment is written once.
#
# BASE_IMAGE: any Debian bookworm with Python 3.11 at `python3` and the venv module. The default is the
# official slim image; machines that cannot pull use `make base-image` (debootstrap, same Python ABI).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="maskrcnn-dist" \
      org.opencontainers.image.description="Mask R-CNN training across machines: launcher + trainer (GPU and CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"

# Two layers, because a layer is written twice while the builder commits it: the CUDA libraries torch
# depends on (~4 GB installed; CUDA_WHEELS, file names that build-image.sh picks from the wheelhouse)
# first, then everything else, which pip finds already satisfied for those. That halves the disk the
# build needs at its peak. The package names are not version-pinned (DL3013) on purpose: the wheelhouse
# is the pin. It holds exactly the versions pyproject.toml resolved to when `make wheelhouse` ran, and
# --no-index stops pip from looking anywhere else. pip itself is removed afterwards: nothing installs
# at run time.
ARG WHEELS_URL
ARG CUDA_WHEELS
RUN test -n "${WHEELS_URL}" || { echo "WHEELS_URL is not set: build with make image (docker/build-image.sh)" >&2; exit 1; } \
    && python3 -m venv /opt/venv \
    && for wheel in ${CUDA_WHEELS}; do echo "${WHEELS_URL}${wheel}"; done > /tmp/cuda-wheels.txt \
    && if [ -s /tmp/cuda-wheels.txt ]; then \
        /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps --requirement /tmp/cuda-wheels.txt; fi \
    && rm /tmp/cuda-wheels.txt
# hadolint ignore=DL3013
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --find-links "${WHEELS_URL}" \
        maskrcnn-dist maskrcnn-launcher dumb-init \
    && /opt/venv/bin/pip uninstall --yes pip \
    && /opt/venv/bin/maskrcnn-launch --help > /dev/null

# An unprivileged user, with a fixed numeric UID/GID so Kubernetes' runAsNonRoot can verify it and the chart's fsGroup matches.
ARG APP_UID=10001
ARG APP_GID=10001
RUN groupadd --gid "${APP_GID}" maskrcnn \
    && useradd --uid "${APP_UID}" --gid "${APP_GID}" --create-home --home-dir /home/maskrcnn \
        --shell /usr/sbin/nologin maskrcnn

COPY docker/entrypoint.sh /usr/local/bin/docker-entrypoint.sh

# PYTHONUNBUFFERED: logs reach `kubectl logs` / `docker logs` as they are written, not at exit.
# PYTHONDONTWRITEBYTECODE: the chart runs with a read-only root filesystem; pip already compiled.
# MPLCONFIGDIR / XDG_CACHE_HOME live under HOME, which the chart mounts as a writable emptyDir.
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/maskrcnn \
    XDG_CACHE_HOME=/home/maskrcnn/.cache \
    MPLCONFIGDIR=/home/maskrcnn/.config/matplotlib

USER ${APP_UID}:${APP_GID}
WORKDIR /home/maskrcnn

# dumb-init is PID 1: it forwards SIGTERM (pod deletion, `docker stop`) to the launcher, which execs
# the trainer in its place, so the trainer gets the signal and can stop cleanly; it also reaps the
# DataLoader's orphaned worker processes. The entrypoint script runs its arguments when the first one
# names a program (`docker run IMAGE maskrcnn-dist ...`, `... bash`) and otherwise hands them all to
# maskrcnn-launch (`docker run IMAGE launch --topology F -- ...`).
ENTRYPOINT ["dumb-init", "--", "docker-entrypoint.sh"]
CMD ["maskrcnn-launch", "--help"]
