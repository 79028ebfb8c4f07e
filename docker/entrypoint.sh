#!/bin/sh
# Image entrypoint (under dumb-init). The image's job is the launcher, so arguments that do not start
# with a program name are the launcher's: `docker run IMAGE launch --topology F -- ...` runs
# `maskrcnn-launch launch ...`. A first argument that names a program on PATH (maskrcnn-launch,
# maskrcnn-dist, python3, sh) runs that program instead. `exec` keeps the signal path intact:
# dumb-init -> this process replaced by the launcher -> replaced by the trainer.
set -eu
if [ "$#" -gt 0 ] && command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi
exec maskrcnn-launch "$@"
