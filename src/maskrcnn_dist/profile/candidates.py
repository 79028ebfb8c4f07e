"""What could run on a topology's pods: ddp over all devices, every contiguous split of the modules
over the available workers, and replicas of each stage on its worker's local devices."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from maskrcnn_launcher.contract import MODULES, placement_problems, validate_placement
from maskrcnn_launcher.topology import Topology


@dataclass(frozen=True)
class Candidate:
    engine: str  # ddp or pipeline
    stages: tuple[tuple[str, ...], ...] = ()  # pipeline: module names per stage, in order
    replicas: tuple[int, ...] = ()  # pipeline: replicas per stage (stage i on worker i)
    devices: int = 1  # ddp: processes (one per device, or per CPU pod)

    @property
    def split(self) -> str:
        if self.engine == "ddp":
            return "whole model"
        return " | ".join("+".join(names) for names in self.stages)


def contiguous_splits(num_stages: int) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every split of MODULES into `num_stages` contiguous runs, in forward order, that the contract
    accepts (a stage of only `transform` is not one: it has no parameters to train)."""
    for cuts in itertools.combinations(range(1, len(MODULES)), num_stages - 1):
        bounds = (0, *cuts, len(MODULES))
        placement = [MODULES[a:b] for a, b in itertools.pairwise(bounds)]
        if not placement_problems(placement):
            yield validate_placement(placement)


def candidates(topology: Topology) -> list[Candidate]:
    """ddp over every device of the topology's pods, then every pipeline split over its workers
    (stage i on worker i, the master holding none) with 1..devices replicas per GPU worker."""
    found = [Candidate("ddp", devices=sum(max(d, 1) for d in topology.node_devices()))]
    workers = topology.workers
    for count in range(1, len(workers) + 1):
        choices = [range(1, max(w.devices, 1) + 1) for w in workers[:count]]
        for stages in contiguous_splits(count):
            for replicas in itertools.product(*choices):
                found.append(Candidate("pipeline", stages, tuple(replicas)))
    return found
