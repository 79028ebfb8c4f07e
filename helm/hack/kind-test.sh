#!/usr/bin/env bash
# `make kind-test`: install the chart with the CPU values on a kind cluster, check that the master
# is reachable (helm test), wait until the master's trainer finishes, check its metrics, uninstall.
#
# Written for users who have kind, kubectl and docker. It cannot run on this project's build
# machines (no kind node image can be pulled, no API server can run there); what can be checked
# there is checked by tests/chart (rendered objects) and the container end-to-end tests.
#
# Idempotent: the cluster is reused when it exists, a previous run's release and volume are
# removed first, and the cluster is left in place for the next run (`kind delete cluster --name
# $KIND_CLUSTER` removes it).
set -euo pipefail

HELM="${HELM:-helm}"
IMAGE_REPO="${IMAGE_REPO:-maskrcnn-dist}"
IMAGE_TAG="${IMAGE_TAG:-0.1.0}"
KIND_CLUSTER="${KIND_CLUSTER:-maskrcnn-dist}"
RELEASE="${RELEASE:-kind-test}"
NAMESPACE="${NAMESPACE:-maskrcnn-kind-test}"
TRAIN_TIMEOUT_S="${TRAIN_TIMEOUT_S:-1800}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
chart="$root/helm"
image="$IMAGE_REPO:$IMAGE_TAG"

for tool in kind kubectl docker "$HELM"; do
    command -v "$tool" >/dev/null || { echo "kind-test: needs $tool on PATH" >&2; exit 2; }
done
kube=(kubectl --context "kind-$KIND_CLUSTER" --namespace "$NAMESPACE")
helm_=("$HELM" --kube-context "kind-$KIND_CLUSTER" --namespace "$NAMESPACE")
fullname="$RELEASE-maskrcnn-dist"
master="$fullname-master-0"

step() { printf '\n== %s\n' "$*"; }
dump() {   # what a user needs to see when something failed
    "${kube[@]}" get pods -o wide || true
    "${kube[@]}" logs --tail=100 "$master" || true
    "${kube[@]}" logs --tail=100 --previous "$master" 2>/dev/null || true
}
trap 'status=$?; if [[ $status -ne 0 ]]; then dump; fi' EXIT

step "cluster $KIND_CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
    kind create cluster --name "$KIND_CLUSTER" --wait 180s
fi
kind load docker-image "$image" --name "$KIND_CLUSTER"
kubectl --context "kind-$KIND_CLUSTER" create namespace "$NAMESPACE" --dry-run=client -o yaml \
    | kubectl --context "kind-$KIND_CLUSTER" apply -f -

step "fresh start: remove a previous run's release and volume"
"${helm_[@]}" uninstall "$RELEASE" --wait --ignore-not-found
"${kube[@]}" delete pvc -l "app.kubernetes.io/instance=$RELEASE" --ignore-not-found --wait
"${kube[@]}" delete pod kind-test-metrics --ignore-not-found --wait

step "install $RELEASE with helm/ci/cpu-values.yaml"
"${helm_[@]}" install "$RELEASE" "$chart" -f "$chart/ci/cpu-values.yaml" \
    --set image.repository="$IMAGE_REPO" --set image.tag="$IMAGE_TAG" --set image.pullPolicy=Never

step "helm test: the master's port is reachable through its DNS name"
"${kube[@]}" wait --for=condition=Ready "pod/$master" --timeout=600s
"${helm_[@]}" test "$RELEASE" --timeout 10m --logs

step "wait for the master's trainer to exit (at most ${TRAIN_TIMEOUT_S}s)"
# StatefulSet pods always restart, so "finished" is the master container's first termination:
# the current state while it is down, afterwards the last state.
deadline=$((SECONDS + TRAIN_TIMEOUT_S))
while :; do
    code="$("${kube[@]}" get pod "$master" -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}{.status.containerStatuses[0].lastState.terminated.exitCode}' | cut -c1-3)"
    if [[ -n "$code" ]]; then
        [[ "$code" == 0 ]] || { echo "kind-test: the master exited with status $code" >&2; exit 1; }
        break
    fi
    (( SECONDS < deadline )) || { echo "kind-test: training did not finish in ${TRAIN_TIMEOUT_S}s" >&2; exit 1; }
    sleep 10
done

step "check the metrics the master wrote on the volume"
claim="$fullname-data"
metrics="/data/runs/$RELEASE/metrics.jsonl"
overrides="$(cat <<JSON
{"spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
  "securityContext": {"runAsNonRoot": true, "runAsUser": 10001, "runAsGroup": 10001},
  "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "$claim", "readOnly": true}}],
  "containers": [{"name": "check", "image": "$image", "imagePullPolicy": "Never",
    "command": ["python3", "-c", "import json, math, sys\nrecs = [json.loads(l) for l in open(sys.argv[1])]\ntrain = [r for r in recs if r.get('kind') == 'train']\nassert train, 'no train records'\nbad = [r for r in train for v in r.values() if isinstance(v, float) and not math.isfinite(v)]\nassert not bad, f'non-finite values: {bad[:1]}'\nprint(len(train), 'train records, last:', json.dumps(train[-1]))", "$metrics"],
    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}],
    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}
JSON
)"
"${kube[@]}" run kind-test-metrics --image="$image" --restart=Never --overrides="$overrides"
"${kube[@]}" wait --for=jsonpath='{.status.phase}'=Succeeded pod/kind-test-metrics --timeout=300s \
    || { "${kube[@]}" logs kind-test-metrics; exit 1; }
"${kube[@]}" logs kind-test-metrics

step "uninstall"
"${kube[@]}" delete pod kind-test-metrics --wait
"${helm_[@]}" uninstall "$RELEASE" --wait
"${kube[@]}" delete pvc -l "app.kubernetes.io/instance=$RELEASE" --wait
echo "kind-test: passed"
