#!/usr/bin/env bash
# Builds the image from the wheelhouse without copying it into the build: `make image` runs this.
#
#   docker/build-image.sh WHEELHOUSE IMAGE BASE_IMAGE
#
# Why not COPY: the classic builder (no BuildKit, so no RUN --mount) keeps every COPY as a layer, so a
# wheelhouse COPYed into a builder stage costs its ~3 GB three times over (build context, layer,
# builder image) beside the ~6 GB environment installed from it and the final stage's copy of that:
# about 18 GB of free disk at the peak. Instead a throwaway container serves the wheelhouse read-only
# on its loopback, and the build's RUN steps join that container's network namespace
# (`--network container:NAME`), so pip reads the wheels over 127.0.0.1 and only the installed
# environment is ever written: 8.5 GB at the peak, measured (11.4 GB with the environment in one
# layer). Works wherever the daemon can bind-mount the wheelhouse (a local daemon, Docker Desktop); the
# server container is removed however the build ends.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 WHEELHOUSE IMAGE BASE_IMAGE" >&2
    exit 2
fi
if [[ ! -d "$1" ]]; then
    echo "build-image: WHEELHOUSE $1: no such folder (make wheelhouse fills it)" >&2
    exit 2
fi
wheelhouse=$(cd "$1" && pwd)
image=$2
base=$3
docker=${DOCKER:-docker}
port=8765
server="maskrcnn-dist-wheels-$$"

if ! "$docker" run --detach --rm --name "$server" --label maskrcnn-dist.stage=wheels \
    --volume "$wheelhouse:/wheels:ro" --network bridge "$base" \
    python3 -m http.server --bind 127.0.0.1 --directory /wheels "$port" >/dev/null 2>/tmp/build-image-$$.err; then
    echo "build-image: cannot start the wheel server in BASE_IMAGE $base (not present here and not pullable?):" \
        "$(head -n 1 /tmp/build-image-$$.err)" >&2
    rm -f /tmp/build-image-$$.err
    exit 1
fi
rm -f /tmp/build-image-$$.err
trap '"$docker" rm --force "$server" >/dev/null 2>&1 || true' EXIT

# The server answers within a second; a base image without python3 fails here, not halfway through.
serving() {
    "$docker" exec "$server" python3 -c \
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/', timeout=1)" 2>/dev/null
}
for _ in $(seq 1 50); do
    serving && break
    sleep 0.2
done
if ! serving; then
    echo "build-image: the wheel server in $base did not answer on 127.0.0.1:$port; its log:" >&2
    "$docker" logs "$server" >&2 || true
    exit 1
fi

# The CUDA libraries get a layer of their own (the Dockerfile says why): nvidia's wheels and triton.
cuda_wheels=$(cd "$wheelhouse" && find . -maxdepth 1 \( -name 'nvidia_*.whl' -o -name 'triton-*.whl' \) \
    -printf '%f ' | sort)
# --no-cache: the builder keys a RUN step's cache on its text, not on the wheels it reads over the
# network, so a cached step would keep the previous build's packages (the local wheels' names do not
# change with the code). The image tag moves to the new image; the one it leaves untagged is removed.
previous=$("$docker" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
DOCKER_BUILDKIT=0 "$docker" build --no-cache --network "container:$server" \
    --build-arg BASE_IMAGE="$base" --build-arg WHEELS_URL="http://127.0.0.1:$port/" \
    --build-arg CUDA_WHEELS="$cuda_wheels" -t "$image" .
if [[ -n "$previous" && "$previous" != "$("$docker" image inspect --format '{{.Id}}' "$image")" ]]; then
    "$docker" image rm "$previous" >/dev/null 2>&1 || true  # kept when another tag or a container uses it
fi
