#!/usr/bin/env bash
# `make kind-test`: the chart on a real (kind) cluster, end to end, with the CPU values.
#
#   1. a kind cluster named $KIND_CLUSTER (created when missing, reused otherwise);
#   2. the JobSet controller, from its release manifest ($JOBSET_VERSION), when the cluster does not
#      serve jobset.x-k8s.io/v1alpha2 yet and WORKLOAD is not statefulset;
#   3. the image $IMAGE_REPO:$IMAGE_TAG loaded into its node (`kind load docker-image`);
#   4. a fresh release: a previous run's release, volume and check pod are removed first;
#   5. `helm install` with helm/ci/cpu-values.yaml (pipeline engine, three CPU pods, synthetic data)
#      and workload=$WORKLOAD (auto: a JobSet, since the cluster serves the API now);
#   6. `helm test` (the master's port answers at its DNS name) while training runs;
#   7. a check pod that mounts the release's volume read-only waits until metrics.jsonl holds every
#      planned step and the final evaluation, then checks the values are finite, the AP keys are
#      there and every checkpoint loads; its log is printed. A JobSet must then reach its Completed
#      condition with no pod left running;
#   8. `helm uninstall` and the volume removed. The cluster (and the JobSet controller) is kept for
#      the next run (`kind delete cluster --name $KIND_CLUSTER` removes it).
#
# Needs kind, kubectl, docker and helm on PATH and a docker daemon kind can use. It cannot run on this
# project's build machines (no kind, no pullable node image, no API server); what can be checked there
# is checked by tests/chart (rendered objects) and `make e2e` (the rendered pods as containers).
#
# Completion is read from the metrics on the volume, not from the master's exit status: StatefulSet
# pods always restart, so a finished master is started again (it finds the plan complete, trains
# nothing and exits 0), and a master that crashed once may still finish after the group restarts.
#
# Environment: HELM, IMAGE_REPO, IMAGE_TAG, KIND_CLUSTER, RELEASE, NAMESPACE, TRAIN_TIMEOUT_S,
# WORKLOAD (auto | statefulset | jobset, default auto), JOBSET_VERSION (default v0.12.0, the version
# whose CRD tests/chart validates the JobSet against).
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
}
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    usage
    exit 0
fi

HELM="${HELM:-helm}"
IMAGE_REPO="${IMAGE_REPO:-maskrcnn-dist}"
IMAGE_TAG="${IMAGE_TAG:-0.1.0}"
KIND_CLUSTER="${KIND_CLUSTER:-maskrcnn-dist}"
RELEASE="${RELEASE:-kind-test}"
NAMESPACE="${NAMESPACE:-maskrcnn-kind-test}"
TRAIN_TIMEOUT_S="${TRAIN_TIMEOUT_S:-1800}"
WORKLOAD="${WORKLOAD:-auto}"
JOBSET_VERSION="${JOBSET_VERSION:-v0.12.0}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
chart="$root/helm"
values="$chart/ci/cpu-values.yaml"
image="$IMAGE_REPO:$IMAGE_TAG"

missing=()
for tool in kind kubectl docker "$HELM"; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    echo "kind-test: needs ${missing[*]} on PATH (it cannot run on machines without kind; see --help)" >&2
    exit 2
fi
docker image inspect "$image" >/dev/null 2>&1 || { echo "kind-test: no image $image (make image)" >&2; exit 2; }

context="kind-$KIND_CLUSTER"
kube=(kubectl --context "$context" --namespace "$NAMESPACE")
helm_=("$HELM" --kube-context "$context" --namespace "$NAMESPACE")
fullname="$RELEASE-maskrcnn-dist"
check_pod="$RELEASE-check"
training_pods="app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/component in (master,worker)"

step() { printf '\n== kind-test: %s\n' "$*"; }
dump() {   # what a user needs to see when something failed
    "${kube[@]}" get pods -o wide || true
    "${kube[@]}" get jobset "$fullname" -o wide 2>/dev/null || true
    for pod in $("${kube[@]}" get pods -l "$training_pods" -o name 2>/dev/null); do
        echo "--- $pod (last 60 lines; previous container, then current)"
        "${kube[@]}" logs --tail=60 --previous "$pod" 2>/dev/null || true
        "${kube[@]}" logs --tail=60 "$pod" 2>/dev/null || true
    done
    "${kube[@]}" logs "$check_pod" 2>/dev/null || true
}
on_exit() {
    local status=$?
    if [[ $status -ne 0 ]]; then
        dump
        echo "kind-test: FAILED (status $status)" >&2
    fi
}
trap on_exit EXIT

step "cluster $KIND_CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
    kind create cluster --name "$KIND_CLUSTER" --wait 180s
fi
kubectl --context "$context" cluster-info >/dev/null
kubectl --context "$context" create namespace "$NAMESPACE" --dry-run=client -o yaml \
    | kubectl --context "$context" apply -f -

if [[ "$WORKLOAD" != statefulset ]] \
   && ! kubectl --context "$context" api-versions | grep -qx 'jobset.x-k8s.io/v1alpha2'; then
    step "JobSet controller $JOBSET_VERSION (the cluster serves no jobset.x-k8s.io/v1alpha2)"
    kubectl --context "$context" apply --server-side \
        -f "https://github.com/kubernetes-sigs/jobset/releases/download/$JOBSET_VERSION/manifests.yaml"
    kubectl --context "$context" -n jobset-system wait --for=condition=Available deployment --all --timeout=300s
fi
kind load docker-image "$image" --name "$KIND_CLUSTER"

step "fresh start: remove a previous run's release, volume and check pod"
"${kube[@]}" delete pod "$check_pod" --ignore-not-found --wait
"${kube[@]}" delete configmap "$check_pod" --ignore-not-found
"${helm_[@]}" uninstall "$RELEASE" --wait --ignore-not-found
"${kube[@]}" delete pvc -l "app.kubernetes.io/instance=$RELEASE" --ignore-not-found --wait

if [[ "$WORKLOAD" != statefulset ]]; then
    # The JobSet webhook answers a little after its Deployment is Available: a server-side dry run
    # of the release's JobSet goes through once it does.
    for attempt in $(seq 1 30); do
        if "$HELM" template "$RELEASE" "$chart" -f "$values" --set workload=jobset --namespace "$NAMESPACE" \
                --show-only templates/jobset.yaml \
           | kubectl --context "$context" --namespace "$NAMESPACE" create --dry-run=server -f - >/dev/null 2>&1; then
            break
        fi
        ((attempt < 30)) || { echo "kind-test: the JobSet webhook does not accept the release's JobSet" >&2; exit 1; }
        sleep 5
    done
fi
step "install $RELEASE with helm/ci/cpu-values.yaml (workload $WORKLOAD)"
"${helm_[@]}" install "$RELEASE" "$chart" -f "$values" --set workload="$WORKLOAD" \
    --set image.repository="$IMAGE_REPO" --set image.tag="$IMAGE_TAG" --set image.pullPolicy=Never
# The plan, from the master's rendered arguments: --max-steps of helm/ci/cpu-values.yaml.
if "${kube[@]}" get jobset "$fullname" >/dev/null 2>&1; then
    jobset=1
    master_selector="jobset.sigs.k8s.io/jobset-name=$fullname,jobset.sigs.k8s.io/replicatedjob-name=master"
    args_json="$("${kube[@]}" get jobset "$fullname" \
        -o jsonpath='{.spec.replicatedJobs[0].template.spec.template.spec.containers[0].args}')"
else
    jobset=0
    master_selector="statefulset.kubernetes.io/pod-name=$fullname-master-0"
    args_json="$("${kube[@]}" get statefulset "$fullname-master" -o jsonpath='{.spec.template.spec.containers[0].args}')"
fi
planned="$(sed -n 's/.*"--max-steps","\([0-9]*\)".*/\1/p' <<<"$args_json")"
[[ -n "$planned" ]] || { echo "kind-test: no --max-steps in the master's args: $args_json" >&2; exit 1; }
echo "kind-test: planned steps: $planned"

step "helm test: the master's port answers at its DNS name (while training)"
for _ in $(seq 1 60); do   # the JobSet's pods appear once the controller has made its Jobs
    [[ -n "$("${kube[@]}" get pods -l "$master_selector" -o name)" ]] && break
    sleep 5
done
"${kube[@]}" wait --for=condition=Ready pod -l "$master_selector" --timeout=600s
master="$("${kube[@]}" get pods -l "$master_selector" -o name | head -n 1)"
"${helm_[@]}" test "$RELEASE" --timeout 10m --logs

step "wait (at most ${TRAIN_TIMEOUT_S}s) until the metrics hold $planned steps and the evaluation, then check them"
run_dir="/data/runs/$RELEASE"
check_script='
import json, math, os, sys, time
run, planned, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
path = os.path.join(run, "metrics.jsonl")
def records():
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out
while True:
    recs = records()
    steps = {r["step"] for r in recs if r.get("kind") == "train"}
    evals = [r for r in recs if r.get("kind") == "eval" and r["step"] == planned]
    if steps >= set(range(1, planned + 1)) and evals:
        break
    if time.monotonic() > deadline:
        sys.exit(f"not finished in time: {len(steps)} of {planned} steps, {len(evals)} final evaluations")
    time.sleep(10)
bad = [r for r in recs for v in r.values() if isinstance(v, float) and not math.isfinite(v)]
assert not bad, f"non-finite values: {bad[:1]}"
for key in ("bbox_AP", "segm_AP"):
    assert key in evals[-1], f"no {key} in {evals[-1]}"
from maskrcnn_dist.checkpoint import list_checkpoints, load_checkpoint
folder = os.path.join(run, "checkpoints")
stray = [n for n in os.listdir(folder) if "checkpoint" in n and not n.endswith(".pt")]
assert not stray, f"partial checkpoint files: {stray}"
ckpts = list_checkpoints(folder)
assert ckpts and load_checkpoint(ckpts[-1])["step"] == planned, f"checkpoints: {ckpts}"
for c in ckpts:
    load_checkpoint(c)
print(f"kind-test: {planned} steps, checkpoints {[c.name for c in ckpts]}, final eval {json.dumps(evals[-1])}")
'
# The script travels in a ConfigMap (kubectl does the quoting); the pod runs it with the image's Python.
"${kube[@]}" delete configmap "$check_pod" --ignore-not-found
"${kube[@]}" create configmap "$check_pod" --from-literal=check.py="$check_script"
overrides="$(cat <<JSON
{"spec": {"restartPolicy": "Never", "automountServiceAccountToken": false, "enableServiceLinks": false,
  "securityContext": {"runAsNonRoot": true, "runAsUser": 10001, "runAsGroup": 10001,
                      "seccompProfile": {"type": "RuntimeDefault"}},
  "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "$fullname-data", "readOnly": true}},
              {"name": "script", "configMap": {"name": "$check_pod"}},
              {"name": "tmp", "emptyDir": {}}],
  "containers": [{"name": "check", "image": "$image", "imagePullPolicy": "Never",
    "command": ["python3", "/check/check.py", "$run_dir", "$planned", "$TRAIN_TIMEOUT_S"],
    "env": [{"name": "HOME", "value": "/tmp"}, {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
            {"name": "MPLCONFIGDIR", "value": "/tmp/.config/matplotlib"}],
    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true},
                     {"name": "script", "mountPath": "/check", "readOnly": true},
                     {"name": "tmp", "mountPath": "/tmp"}],
    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]}}}]}}
JSON
)"
"${kube[@]}" run "$check_pod" --image="$image" --restart=Never --overrides="$overrides"
deadline=$((SECONDS + TRAIN_TIMEOUT_S + 300))
while :; do
    phase="$("${kube[@]}" get pod "$check_pod" -o jsonpath='{.status.phase}')"
    [[ "$phase" == Succeeded ]] && break
    [[ "$phase" == Failed ]] && { echo "kind-test: the check failed" >&2; exit 1; }
    ((SECONDS < deadline)) || { echo "kind-test: the check pod did not finish (phase $phase)" >&2; exit 1; }
    # Progress for the person waiting: the master's latest progress line.
    "${kube[@]}" logs --tail=200 "$master" 2>/dev/null | grep -E '^(train|val|eval) step' | tail -n 1 || true
    sleep 15
done
"${kube[@]}" logs "$check_pod"
"${kube[@]}" get pods -o wide
if ((jobset)); then
    step "the JobSet completes: the master's success stops every pod"
    "${kube[@]}" wait --for=condition=Completed "jobset/$fullname" --timeout=600s
    "${kube[@]}" get jobset "$fullname" -o wide
    for _ in $(seq 1 60); do
        running="$("${kube[@]}" get pods -l "$training_pods" --field-selector=status.phase=Running -o name)"
        [[ -z "$running" ]] && break
        sleep 5
    done
    [[ -z "$running" ]] || { echo "kind-test: pods still running after the JobSet completed: $running" >&2; exit 1; }
fi

step "uninstall"
"${kube[@]}" delete pod "$check_pod" --wait
"${kube[@]}" delete configmap "$check_pod"
"${helm_[@]}" uninstall "$RELEASE" --wait
"${kube[@]}" delete pvc -l "app.kubernetes.io/instance=$RELEASE" --wait
echo "kind-test: passed"
