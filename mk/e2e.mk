# Container end-to-end tests: `make e2e`. Included from the Makefile after mk/deploy.mk, whose
# IMAGE, BASE_IMAGE, LOCAL_BASE_IMAGE, DOCKER, HELM, WHEELHOUSE, WHEEL_STAMP and the `image`, `helm`
# and `base-image` targets it uses.
#
# Needs a running docker daemon (and, without a reachable registry, root + debootstrap for the local
# base image); `.ci/run` installs and starts both on a fresh machine. Everything the harness starts is
# removed when it ends, failed or not; `make e2e-clean` removes leftovers of a harness that was killed.

# The whole harness is bounded; on the bound it gets SIGTERM (and removes its containers), then SIGKILL.
E2E_TIMEOUT ?= 2400
# Scenario selection, e.g. E2E_ARGS='--only pipeline,ddp' or E2E_ARGS='--skip restart-alone'.
E2E_ARGS    ?=
# Scenarios run at once, each in its own process and cluster, the longest first; 1 runs them one by
# one in registry order. Mostly they wait (back-offs, timeouts, restarts), so two fit on 2 cores.
E2E_JOBS    ?= 2
# `ddp` runs only the ddp scenarios (for trees where the pipeline engine is not usable).
E2E_ENGINES ?= pipeline,ddp
# The image id `e2e-image` last built, so an unchanged tree does not rebuild (a build re-installs every
# wheel: docker/build-image.sh builds without the builder's cache).
E2E_IMAGE_STAMP := $(WHEELHOUSE)/.e2e-image-id
# Free disk the image build needs where docker keeps its images (checked first, for a clear error).
E2E_MIN_FREE_GB ?= 10

.PHONY: e2e e2e-image e2e-list e2e-clean

e2e: install helm e2e-image ## run the chart's pods as containers on a docker network: pipeline, ddp, start order, bare-node recipe, fault recovery, JobSet (emulated controller)
	timeout --signal=TERM --kill-after=60 $(E2E_TIMEOUT) \
	    $(BIN)/python -m e2e run --image $(IMAGE) --helm $(HELM) --engines $(E2E_ENGINES) --jobs $(E2E_JOBS) $(E2E_ARGS)

# Builds $(IMAGE) unless the one built last from this wheelhouse, Dockerfile and entrypoint is still
# there. The base: BASE_IMAGE when it is present or can be pulled, else the local debootstrap one
# (machines without a registry, such as this project's build machines); no flag needed.
e2e-image: $(WHEEL_STAMP)
	@set -euo pipefail; \
	root=$$($(DOCKER) info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker); \
	free=$$(df --output=avail -BG "$$root" 2>/dev/null | tail -n 1 | tr -dc 0-9); \
	if [[ -n "$$free" && "$$free" -lt $(E2E_MIN_FREE_GB) ]]; then \
	    echo "e2e: $$root has $${free} GB free; building the image needs about $(E2E_MIN_FREE_GB) GB (the 6 GB image" \
	         "is written twice per layer while it is built: 8.5 GB at the peak). Free space, e.g. docker image prune" >&2; exit 1; \
	fi; \
	if [[ -f $(E2E_IMAGE_STAMP) && $(E2E_IMAGE_STAMP) -nt $(WHEEL_STAMP) && $(E2E_IMAGE_STAMP) -nt Dockerfile \
	      && $(E2E_IMAGE_STAMP) -nt docker/entrypoint.sh ]] \
	   && [[ "$$($(DOCKER) image inspect --format '{{.Id}}' $(IMAGE) 2>/dev/null)" == "$$(cat $(E2E_IMAGE_STAMP))" ]]; then \
	    echo "e2e: $(IMAGE) is up to date"; exit 0; \
	fi; \
	if $(DOCKER) image inspect $(BASE_IMAGE) >/dev/null 2>&1 \
	   || timeout 120 $(DOCKER) pull --quiet $(BASE_IMAGE) >/dev/null 2>&1; then base=$(BASE_IMAGE); \
	else base=$(LOCAL_BASE_IMAGE); echo "e2e: $(BASE_IMAGE) cannot be pulled; building on $$base"; fi; \
	$(MAKE) --no-print-directory image BASE_IMAGE=$$base; \
	$(DOCKER) image inspect --format '{{.Id}}' $(IMAGE) > $(E2E_IMAGE_STAMP)

e2e-list: install ## list the e2e scenarios
	$(BIN)/python -m e2e list

e2e-clean: install ## remove containers and networks a killed e2e run left behind (label maskrcnn-e2e)
	$(BIN)/python -m e2e clean
