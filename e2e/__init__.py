"""Multi-host end-to-end tests in containers: the chart's rendered pods run as docker containers.

`python -m e2e run` (what `make e2e` runs) renders the Helm chart with a `helm/ci/` values file,
hands the objects to an emulated Kubernetes (cluster/: each pod one container on a user-defined
docker network, with its pod name, DNS aliases, downward-API environment, `$(VAR)` expansion,
ConfigMap and volume mounts and security context; the kubelet's restartPolicy Always; the Job and
JobSet controllers) and runs the scenarios (scenarios/, by workload): training across the
containers, start order, the docs' bare-node recipe, fault recovery, and the JobSet workload's
group restarts, success, fail-fast on a user error and max restarts.

Modules:
  cluster/      the emulated Kubernetes, fenced: scenarios use only what cluster/__init__.py exports,
                and it knows nothing of them; cluster/README.md lists how it differs from a real one
  scenarios/    the scenarios by workload (statefulset, bare_nodes, jobset), their shared deployment
                and chart helpers, and the registry `SCENARIOS`
  checks.py     assertions on what the master wrote to the shared volume (metrics, checkpoints)
  schedule.py   which scenarios run when: up to --jobs at once, the longest first; a stop stops them all
  runner.py     one scenario run and reported, in a process of its own
  __main__.py   the command line
"""
