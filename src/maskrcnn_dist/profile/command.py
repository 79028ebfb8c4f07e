"""`maskrcnn-dist profile` as a library call: measure, model every candidate, rank, write."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.topology import Topology, load_topology

from ..config import ProfileConfig, TrainConfig
from ..data.coco import CocoInstanceDataset
from ..data.layout import find_split
from ..errors import UserError
from ..run_dir import output_file_problem
from ..train import setup_process
from .candidates import Candidate, candidates
from .measure import NUM_CLASSES, Batch, Measurements, measure
from .model import Prediction, Setting, predict
from .recommend import limits, rank, recommended, table, why
from .write import launchable, topology_document, write_topology, write_values

_GIB = 1024**3


@dataclass(frozen=True)
class ProfileReport:
    measurements: Measurements
    setting: Setting
    ranked: list[Prediction]
    best: Prediction | None

    def lines(self) -> list[str]:
        m = self.measurements
        head = [
            f"profile: {m.device}, {m.threads} thread(s), micro-batch of {m.micro_batch_images} image(s) of "
            f"{m.image_size[0]}x{m.image_size[1]} px, batch {self.setting.batch}, {self.setting.micro_batches} "
            f"micro-batch(es)",
            "module      fwd s    bwd s    opt s    params    activations  bytes out fwd/bwd",
        ]
        cuts = {c.after: c for c in m.cuts}
        for mod in m.modules:
            cut = cuts.get(mod.name)
            out = f"{cut.forward_bytes / 1e6:.2f}/{cut.backward_bytes / 1e6:.2f} MB" if cut else "-"
            head.append(
                f"{mod.name:<10}  {mod.forward_s:7.3f}  {mod.backward_s:7.3f}  {mod.optimizer_s:7.3f}  "
                f"{mod.param_bytes / 1e6:6.1f} MB  {mod.activation_bytes / 1e6:8.1f} MB  {out}"
            )
        return [
            *head,
            "",
            *table(self.ranked),
            "",
            why(self.best, self.ranked),
            "limits:",
            *[f"  - {line}" for line in limits(m, self.setting)],
        ]


def device_memory_bytes(options: ProfileConfig, device: torch.device, processes_on_host: int) -> int:
    """The capacity of one device: the flag, else the GPU's memory, else this host's RAM shared by the
    processes that run on it."""
    if options.device_memory_gib is not None:
        return int(options.device_memory_gib * _GIB)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(1, processes_on_host)


def load(ref: str | None) -> Topology:
    try:
        return load_topology(ref)
    except LauncherError as exc:
        raise UserError(str(exc)) from exc


def profile(cfg: TrainConfig, options: ProfileConfig) -> ProfileReport:
    """Measure on this device, predict every candidate of the topology, rank; write the best's
    topology when asked (never one that does not fit)."""
    if problem := cfg.micro_batches_problem():  # every pipeline candidate splits the batch so
        raise UserError(problem)
    topology = load(options.topology)
    for flag, path in (("--write-topology", options.write_topology), ("--write-values", options.write_values)):
        # Before minutes of measuring: a path that cannot be written would lose them.
        if path is not None and (problem := output_file_problem(path, flag, (".yaml", ".yml"))):
            raise UserError(problem)
    setup_process(cfg)
    device = torch.device("cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu")
    estimate = topology.estimate
    batches: list[Batch] = []
    num_classes, data = NUM_CLASSES, "synthetic"
    if cfg.data.data_path is not None:
        batches, num_classes, data = real_batches(cfg, options.iterations)
    meas = measure(
        cfg, estimate.image_size, estimate.instances_per_image, options.iterations, device, batches, num_classes, data
    )
    processes = topology.nnodes if options.shared_host else 1
    setting = Setting(
        batch=cfg.data.batch_size,
        micro_batches=cfg.pipeline.micro_batches,
        link_gbps=options.link_gbps,
        device_memory_bytes=device_memory_bytes(options, device, processes),
        shared_cores=(os.cpu_count() or 1) if options.shared_host and device.type == "cpu" else None,
    )
    # Only what the launcher would start on these pods (e.g. no ddp over a CPU master and GPU workers).
    runnable = [cand for cand in candidates(topology) if launchable(cand, topology)]
    ranked = rank([predict(meas, cand, setting) for cand in runnable])
    best = recommended(ranked)
    for flag, path in (("--write-topology", options.write_topology), ("--write-values", options.write_values)):
        if path is not None and best is None:
            raise UserError(f"{flag} {path}: no candidate fits in memory, nothing written")
    if best is not None:
        write(best.candidate, topology, cfg, meas, options)
    return ProfileReport(meas, setting, ranked, best)


def real_batches(cfg: TrainConfig, count: int) -> tuple[list[Batch], int, str]:
    """Up to `count` micro-batches of the train split under --data-path, in file order, the class
    count the model needs for it, and a line saying what they hold."""
    path = cfg.data.data_path
    image_dir, annotations = find_split(path, "train")
    dataset = CocoInstanceDataset(image_dir, annotations, train=False)
    micro = max(1, cfg.data.batch_size // max(1, cfg.pipeline.micro_batches))
    if len(dataset) < micro:
        raise UserError(f"--data-path {path}: {len(dataset)} training image(s), fewer than a micro-batch of {micro}")
    samples = [dataset[i] for i in range(min(len(dataset), micro * count) // micro * micro)]
    batches = [
        ([image for image, _ in samples[j : j + micro]], [target for _, target in samples[j : j + micro]])
        for j in range(0, len(samples), micro)
    ]
    instances = sum(len(target["boxes"]) for _, target in samples) / len(samples)
    what = f"{len(batches)} micro-batch(es) of {path} (mean {instances:.2f} instances per image)"
    return batches, dataset.num_classes, what


def write(cand: Candidate, topology: Topology, cfg: TrainConfig, meas: Measurements, options: ProfileConfig) -> None:
    doc = topology_document(
        cand,
        topology,
        batch=cfg.data.batch_size,
        micro_batches=cfg.pipeline.micro_batches,
        image_size=meas.image_size,
        instances=meas.instances_per_image,
        feature_dtype="bfloat16" if cfg.pipeline.bf16_transport else "float32",
    )
    try:
        if options.write_topology is not None:
            write_topology(options.write_topology, doc)
        if options.write_values is not None:
            write_values(options.write_values, doc)
    except LauncherError as exc:  # a bug here, but say where rather than crash
        raise UserError(f"--write-topology: the recommended topology does not validate: {exc}") from exc
    except ValueError as exc:
        raise UserError(f"--write-values {options.write_values}: {exc}") from exc
    except OSError as exc:
        raise UserError(f"cannot write {exc.filename}: {exc.strerror}") from exc
