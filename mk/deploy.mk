# Deployment targets: wheelhouse, base-image, image, manifests, lint-deploy, kind-test, helm.
# Included from the Makefile, which defines VENV, BIN and STAMP (and the `install` target).
#
# Nothing here installs system packages or starts daemons: `base-image` and `image` need a running
# docker daemon (and `base-image` also debootstrap, as root), `kind-test` needs kind, kubectl and
# docker. The only tools fetched are helm/kubectl into $(TOOLS) (a local folder) when none is on PATH.

# Image coordinates. `image` builds $(IMAGE_REPO):$(IMAGE_TAG) from $(BASE_IMAGE). The tag defaults to
# the chart's appVersion, which is also the chart's default image tag: one place to bump.
IMAGE_REPO       ?= maskrcnn-dist
IMAGE_TAG        ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' helm/Chart.yaml)
IMAGE            := $(IMAGE_REPO):$(IMAGE_TAG)
# Machines that can pull use the official slim image; machines that cannot run `make base-image`
# once and build with `make image BASE_IMAGE=$(LOCAL_BASE_IMAGE)` (same Python 3.11 ABI).
BASE_IMAGE       ?= python:3.11-slim-bookworm
LOCAL_BASE_IMAGE ?= maskrcnn-dist-base:bookworm
DEBIAN_MIRROR    ?= http://deb.debian.org/debian
DOCKER           ?= docker
WHEELHOUSE       ?= wheelhouse
TOOLS            ?= .tools
CHART            := helm
KIND_CLUSTER     ?= maskrcnn-dist
# kind-test: auto (a JobSet: the JobSet controller is installed when the cluster has none), statefulset, jobset.
WORKLOAD         ?= auto
JOBSET_VERSION   ?= v0.12.0

# A helm on PATH wins; otherwise the pinned one that helm/hack/get-helm.sh puts into $(TOOLS).
HELM ?= $(or $(shell command -v helm 2>/dev/null),$(TOOLS)/helm)

# The wheelhouse is what the image installs from (and only from): the two local packages built as
# wheels plus every dependency as a cp311 manylinux x86_64 wheel, so `docker build` needs no network.
# The stamp depends on the package definitions and sources: the local wheels carry the code.
WHEEL_STAMP   := $(WHEELHOUSE)/.complete
WHEEL_SOURCES := pyproject.toml launcher/pyproject.toml \
                 $(shell find src/maskrcnn_dist launcher/maskrcnn_launcher -name '*.py' 2>/dev/null)
# pip does not widen a --platform tag to older glibc versions, so every manylinux tag up to
# bookworm's glibc 2.36 is listed (plus the legacy aliases some wheels carry alone).
MANYLINUX  := $(foreach v,$(shell seq 5 36),manylinux_2_$(v)_x86_64) \
              manylinux1_x86_64 manylinux2010_x86_64 manylinux2014_x86_64
PIP_TARGET := --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
              $(addprefix --platform ,$(MANYLINUX))

.PHONY: wheelhouse base-image image manifests lint-deploy kind-test helm

helm: $(if $(filter $(TOOLS)/helm,$(HELM)),$(TOOLS)/helm) ## make helm available (PATH, else pinned into .tools/)
# Re-run when the script's pin changes; the script itself is a no-op when the pinned helm is there.
$(TOOLS)/helm: helm/hack/get-helm.sh
	PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) helm/hack/get-helm.sh $(TOOLS)
	@touch $@

wheelhouse: $(WHEEL_STAMP) ## download the image's wheels (cp311 manylinux) + build the local packages' wheels
$(WHEEL_STAMP): $(STAMP) $(WHEEL_SOURCES)
	mkdir -p $(WHEELHOUSE)
	rm -f $(WHEELHOUSE)/maskrcnn_dist-*.whl $(WHEELHOUSE)/maskrcnn_launcher-*.whl
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir $(WHEELHOUSE) ./launcher .
	$(BIN)/python -m pip download --quiet --dest $(WHEELHOUSE) $(PIP_TARGET) \
	    $(WHEELHOUSE)/maskrcnn_dist-*.whl $(WHEELHOUSE)/maskrcnn_launcher-*.whl dumb-init==1.2.5.post1
	touch $@

# debootstrap minbase + python3: the same Debian bookworm Python 3.11 as python:3.11-slim-bookworm.
# Idempotent: skipped when the image exists. Needs root, debootstrap and a docker daemon.
base-image: ## local Debian base image (debootstrap; root) for machines that cannot pull python:3.11-slim
	@if $(DOCKER) image inspect $(LOCAL_BASE_IMAGE) >/dev/null 2>&1; then \
	    echo "$(LOCAL_BASE_IMAGE) exists"; \
	else \
	    set -euo pipefail; root=$$(mktemp -d); trap 'rm -rf "$$root"' EXIT; \
	    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
	        bookworm "$$root" $(DEBIAN_MIRROR); \
	    rm -rf "$$root"/var/cache/apt/archives/*.deb "$$root"/var/lib/apt/lists/*; \
	    tar -C "$$root" -c . | $(DOCKER) import - $(LOCAL_BASE_IMAGE); \
	fi

# The classic builder (no BuildKit) is what this project's machines have; the Dockerfile needs no
# BuildKit feature, and the wheelhouse reaches the build over loopback (docker/build-image.sh says why).
# The local base image is built first when it is the one asked for. The base must be present or
# pullable: the wheel server runs in it.
image: $(WHEEL_STAMP) $(if $(filter $(LOCAL_BASE_IMAGE),$(BASE_IMAGE)),base-image) ## build maskrcnn-dist:0.1.0 from the wheelhouse (no pull: BASE_IMAGE=maskrcnn-dist-base:bookworm)
	DOCKER=$(DOCKER) docker/build-image.sh $(WHEELHOUSE) $(IMAGE) $(BASE_IMAGE)

# k8s/ is the chart rendered with its default values; tests/chart checks it stays in sync.
manifests: $(STAMP) helm ## render the chart's defaults into k8s/ (plain manifests for kubectl apply -k k8s/)
	$(BIN)/python helm/hack/render_manifests.py --helm $(HELM) --chart $(CHART) --out k8s

lint-deploy: $(STAMP) helm ## hadolint the Dockerfile, helm lint the chart with every ci/ scenario
	$(BIN)/hadolint Dockerfile
	$(HELM) lint --strict $(CHART)
	for f in $(CHART)/ci/*-values.yaml; do $(HELM) lint --strict $(CHART) -f $$f || exit 1; done

# Cannot run on this project's build machines (no kind, no pullable node image, no API server); it is
# written for users with kind + kubectl + docker (helm is fetched like for `manifests`). The tools are
# checked before the image is built, so a machine without them fails in a second, not after a build.
# Idempotent: reuses the cluster (and the JobSet controller it installs there when the cluster has none),
# replaces a previous run's release. WORKLOAD=statefulset tests the StatefulSets instead of the JobSet.
# Steps: helm/hack/kind-test.sh --help.
kind-test: ## CPU pipeline job on a kind cluster: installs the JobSet controller if missing, ci/cpu-values.yaml, helm test, metrics, JobSet Completed (needs kind+kubectl+docker and the internet: cannot run on build machines)
	@for tool in kind kubectl $(DOCKER); do command -v $$tool >/dev/null 2>&1 || { \
	    echo "kind-test: needs $$tool on PATH; it runs only where kind can make a cluster (not on this project's build machines)" >&2; \
	    exit 2; }; done
	$(MAKE) --no-print-directory image helm
	HELM=$(HELM) IMAGE_REPO=$(IMAGE_REPO) IMAGE_TAG=$(IMAGE_TAG) KIND_CLUSTER=$(KIND_CLUSTER) \
	    WORKLOAD=$(WORKLOAD) JOBSET_VERSION=$(JOBSET_VERSION) helm/hack/kind-test.sh
