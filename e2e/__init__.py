"""Multi-host end-to-end tests in containers: the chart's rendered pods run as docker containers.

`python -m e2e run` (what `make e2e` runs) renders the Helm chart with a `helm/ci/` values file,
turns each StatefulSet pod into one container on a user-defined docker network (pod names, DNS
aliases, downward-API environment, `$(VAR)` expansion, ConfigMap and volume mounts, security
context: see kube.py and docker.py), and runs the scenarios in scenarios.py: training across the
containers, start order, the README's bare-node recipe, and fault recovery. The `jobset*` scenarios
render the chart as a JobSet and run its pods under an emulated JobSet controller (jobset.py): group
restarts, success, fail-fast on a user error, max restarts.

Modules:
  kube.py       chart -> `PodSpec`s (helm template, StatefulSets, kubelet-style env and args)
  jobset.py     the JobSet and Job controllers' documented behaviour over containers
  docker.py     `PodSpec` -> `docker run` arguments; a `Cluster` that removes everything it made
  checks.py     assertions on what the master wrote to the shared volume (metrics, checkpoints)
  scenarios.py  the scenarios, each bounded in time
  __main__.py   the command line
"""
