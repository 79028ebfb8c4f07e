"""Replica devices and TensorPipe device maps for the pipeline engine.

Who calls whom in the pipeline, and what the calls carry (always by value, in their arguments):

* master -> stage-1 worker: a micro-batch's images + targets. The master is CPU-only (the topology
  refuses devices on a pipeline master): CPU tensors need no map.
* stage-k worker -> stage-(k+1) worker: the micro-batch's activations (features, targets, ...). The
  caller is stage k; TensorPipe takes the map from the caller's options (`device_maps[callee]`,
  caller device -> callee device). The answer (nothing, or the last stage's CPU results) needs none.
* stage-(k+1) worker -> stage-k worker: the gradients of those activations, in backward. The caller
  is stage k+1, with its own map for stage k.
* master -> every stage: the step's reduction and update, checkpoints: plain values and CPU tensors.

So every edge between two GPU stages has two maps, one per direction, each set by its sender.

Rule (identity by replica index): replica r runs on `cuda:r` on every GPU worker, and a sender's map
for its neighbour is `{cuda:r: cuda:r for r < min(its replicas, the neighbour's)}`: one-to-one, as
TensorPipe requires, and landing on a replica's own device. A sender replica beyond the neighbour's
count sends through a covered device of its own worker (a local copy first); the receiver moves a
micro-batch to the replica that takes it when it landed elsewhere (a local copy).

Maps exist on every edge whose ends are both GPU stages, unless the topology says `transport: cpu`
(then every tensor is staged through host memory); an edge with a CPU end stages through host memory.
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


def resolved_transport(stages: Sequence[StagePlacement], transport: str) -> str:
    """What the pods are told: "auto" is "device_maps" when some edge joins two GPU stages, else "cpu"."""
    if transport != "auto":
        return transport
    gpu_edge = any(edge_device_map(transport, a.devices, b.devices) for a, b in zip(stages, stages[1:]))
    return "device_maps" if gpu_edge else "cpu"


def pipeline_device_maps(stages: Sequence[StagePlacement], transport: str) -> dict[str, dict[str, DeviceMap]]:
    """{caller rpc name: {callee rpc name: {caller device: callee device}}} for the whole job: for each
    edge, the forward map (activations) in stage k's options and the backward map (gradients) in stage
    k+1's."""
    maps: dict[str, dict[str, DeviceMap]] = {}
    for prev, nxt in zip(stages, stages[1:], strict=False):
        for sender, receiver, what in ((prev, nxt, "activations"), (nxt, prev, "gradients")):
            mapping = edge_device_map(transport, sender.devices, receiver.devices)
            if not mapping:
                continue  # a CPU end or transport cpu: tensors are staged through host memory
            check_one_to_one(mapping, f"device map {sender.rpc_name} -> {receiver.rpc_name} ({what})")
            maps.setdefault(sender.rpc_name, {})[receiver.rpc_name] = mapping
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
