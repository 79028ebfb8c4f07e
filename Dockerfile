# One image for GPU and CPU nodes: the launcher + the trainer; the entrypoint is the launcher.
#
# Built with the classic builder (no BuildKit here: no RUN --mount, no heredocs) and without network:
# everything is installed from ./wheelhouse, which `make wheelhouse` fills on the host (cp311 manylinux
# wheels of every dependency plus the two local packages). `make image` builds it.
#
# BASE_IMAGE: any Debian bookworm with Python 3.11 at `python3` and the venv module. The default is the
# official slim image; machines that cannot pull use `make base-image` (debootstrap, same Python ABI).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------------
# builder: a virtual environment in /opt/venv, filled from the wheelhouse only (--no-index).
# The wheelhouse (~2.6 GB) stays in this stage; only the installed environment is copied on.
FROM ${BASE_IMAGE} AS builder
# The classic builder keeps this stage as an untagged ~9 GB image; `make image` prunes it by this label.
LABEL maskrcnn-dist.stage=builder

COPY wheelhouse/ /wheelhouse/
# The package names are not version-pinned (DL3013) on purpose: the wheelhouse is the pin. It holds
# exactly the versions pyproject.toml resolved to when `make wheelhouse` ran, and --no-index stops pip
# from looking anywhere else. pip itself is removed afterwards: nothing installs at run time.
# hadolint ignore=DL3013
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse \
        maskrcnn-dist maskrcnn-launcher dumb-init \
    && /opt/venv/bin/pip uninstall --yes pip \
    && /opt/venv/bin/maskrcnn-launch --help > /dev/null

# ---------------------------------------------------------------------------------------------------
# runtime: the base image + the environment + an unprivileged user. No compilers, no wheelhouse.
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="maskrcnn-dist" \
      org.opencontainers.image.description="Mask R-CNN training across machines: launcher + trainer (GPU and CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric UID/GID so Kubernetes' runAsNonRoot can verify it and the chart's fsGroup matches.
ARG APP_UID=10001
ARG APP_GID=10001
RUN groupadd --gid "${APP_GID}" maskrcnn \
    && useradd --uid "${APP_UID}" --gid "${APP_GID}" --create-home --home-dir /home/maskrcnn \
        --shell /usr/sbin/nologin maskrcnn

COPY --from=builder /opt/venv /opt/venv
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
