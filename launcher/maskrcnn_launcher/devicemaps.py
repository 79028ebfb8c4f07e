"""Replica devices and TensorPipe device maps for the pipeline engine.

Who calls whom in the pipeline (and so whose `TensorPipeRpcBackendOptions` needs which map):

* master -> stage-1 worker: the request carries images + targets. The master is CPU-only (the
  topology refuses devices on a pipeline master), so there is no map: CPU tensors need none.
* master -> stage-k worker (k > 1): the request carries an RRef to stage k-1's output and small
  metadata; the response of the last stage carries the losses. The master has no GPU, so the
  last stage must return CPU tensors; no map.
* stage-k worker -> stage-(k-1) worker: stage k fetches its input with `RRef.to_here()`. That is an
  RPC whose CALLER is stage k and whose RESPONSE carries the features. TensorPipe takes the map
  from the caller's options (`device_maps[callee]`, local device -> remote device) and places the
  response's tensors through the INVERSE of that map. dist_autograd's backward sends the feature
  gradients from stage k to stage k-1, i.e. in the forward direction of the same map.

Rule (identity by replica index): replica r runs on `cuda:r` on every GPU worker, and stage k's map
for stage k-1 is `{cuda:r: cuda:r for r < replicas of stage k-1}`. So stage k-1 replica r's features
arrive on stage k's `cuda:r` (the trainer moves them to the replica that takes the micro-batch
when that is another device: a local copy). The map is one-to-one as TensorPipe requires, covers
every device the callee can respond from (the topology checks stage k has at least as many replicas
as stage k-1), and is its own inverse, so requests, responses and gradients all agree.

Maps exist only when both ends have GPUs and the topology opts in with `transport: device_maps`.
The default, `transport: cpu`, stages tensors through host memory: the RPC docs mark dist_autograd
with CUDA tensors over RPC as unsupported.
"""

from __future__ import annotations

from collections.abc import Sequence

from maskrcnn_launcher.contract import StagePlacement, edge_device_map
from maskrcnn_launcher.errors import TopologyError
from maskrcnn_launcher.topology import Worker

DeviceMap = dict[str, str]


def replica_devices(worker: Worker) -> tuple[str, ...]:
    """Replica r on `cuda:r`; on a worker without GPUs every replica is a CPU replica."""
    if worker.devices == 0:
        return ("cpu",) * worker.replicas
    return tuple(f"cuda:{r}" for r in range(worker.replicas))


def is_cuda(device: str) -> bool:
    return device.startswith("cuda:")


def pipeline_device_maps(stages: Sequence[StagePlacement], transport: str) -> dict[str, dict[str, DeviceMap]]:
    """{caller rpc name: {callee rpc name: {caller device: callee device}}} for the whole job."""
    maps: dict[str, dict[str, DeviceMap]] = {}
    if transport != "device_maps":
        return maps
    for prev, nxt in zip(stages, stages[1:], strict=False):
        mapping = edge_device_map(transport, prev.devices, nxt.devices)
        if not mapping:
            continue  # a CPU end: tensors are staged through host memory, no map
        if len(nxt.devices) < len(prev.devices):
            # topology.py refuses this; kept here so the rule cannot be bypassed by a caller.
            raise TopologyError(
                f"{nxt.rpc_name} has {len(nxt.devices)} replica device(s) but {prev.rpc_name} responds from "
                f"{len(prev.devices)}: a one-to-one device map cannot cover them"
            )
        # Caller: nxt (it calls to_here() on prev's RRef). Key: its device; value: prev's device.
        check_one_to_one(mapping, f"device map {nxt.rpc_name} -> {prev.rpc_name}")
        maps.setdefault(nxt.rpc_name, {})[prev.rpc_name] = mapping
    return maps


def inverse(mapping: DeviceMap) -> DeviceMap:
    """The map TensorPipe applies to a response: callee device -> caller device."""
    check_one_to_one(mapping, "device map")
    return {remote: local for local, remote in mapping.items()}


def check_one_to_one(mapping: DeviceMap, where: str) -> None:
    """Refuse what TensorPipe would refuse at init (or worse, at the first response)."""
    problems = []
    for local, remote in mapping.items():
        for device in (local, remote):
            if not is_cuda(device) or not device[5:].isdigit():
                problems.append(f"{where}: {device!r} is not a CUDA device 'cuda:<n>' (CPU tensors need no map)")
    remotes = list(mapping.values())
    for remote in sorted({r for r in remotes if remotes.count(r) > 1}):
        sources = sorted(k for k, v in mapping.items() if v == remote)
        problems.append(
            f"{where}: not one-to-one: {', '.join(sources)} all map to {remote} (responses could not be mapped back)"
        )
    if problems:
        raise TopologyError(problems)
