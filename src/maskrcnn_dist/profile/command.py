"""`maskrcnn-dist profile` as a library call: measure, model every candidate, rank, write."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.topology import Topology, load_topology

from ..config import ProfileConfig, TrainConfig, fp16_on_cpu_problem
from ..data import open_split
from ..data.sources.resolve import names_data
from ..engines.base import resolve_device
from ..errors import UserError
from ..modeling.perf import setup_process
from ..run_dir import output_file_problem
from .candidates import Candidate, candidates
from .cost_model import Prediction, Setting, predict
from .measure import Batch, Measurements, measure
from .recommend import limits, rank, recommended, table, why
from .write import chart_values_problem, launchable, topology_document, write_topology, write_values

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
    topology = load(options.topology)
    device = preflight(cfg, options, topology)
    setup_process(cfg)
    real = real_batches(cfg, options.iterations) if names_data(cfg.data) else None
    if real is None:
        estimate = topology.estimate
        meas = measure(cfg, estimate.image_size, estimate.instances_per_image, options.iterations, device)
    else:
        # What the real images hold, not the topology's estimate: the report and the written topology say so.
        meas = measure(
            cfg, real.image_size, real.instances, options.iterations, device, real.batches, real.num_classes, real.what
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


def preflight(cfg: TrainConfig, options: ProfileConfig, topology: Topology) -> torch.device:
    """The device to measure on, once every input is known to work: each problem found here would
    otherwise surface after minutes of measuring (or, for a GPU that is not there, as a CPU profile
    labelled with the flags of a GPU one). UserError naming the flag, all problems in one line."""
    problems: list[str | None] = [
        cfg.micro_batches_problem(),  # every pipeline candidate splits the batch
        *(
            output_file_problem(Path(path), flag, (".yaml", ".yml"))
            for flag, path in (("--write-topology", options.write_topology), ("--write-values", options.write_values))
            if path is not None
        ),
    ]
    if options.write_values is not None:
        problems.append(
            chart_values_problem([w.devices for w in topology.workers], f"--write-values {options.write_values}")
        )
    try:
        device = resolve_device(cfg.device)
    except UserError as exc:
        problems.append(str(exc))
        device = torch.device("cpu")
    if device.type == "cpu":  # --device auto on a host without a GPU: the engines refuse it there too
        problems.append(fp16_on_cpu_problem(cfg.amp, cfg.amp_dtype))
    if found := [p for p in problems if p]:
        raise UserError("; ".join(found))
    return device


@dataclass(frozen=True)
class RealBatches:
    """Micro-batches of the train split the data flags name and what they hold."""

    batches: list[Batch]
    num_classes: int  # the class count the model needs for them
    image_size: tuple[int, int]  # the largest height and width among them (a batch is padded to them)
    instances: int  # instances per image, the mean rounded up (memory estimates stay on the safe side)
    what: str  # a line saying what they are


def real_batches(cfg: TrainConfig, count: int) -> RealBatches:
    """Up to `count` micro-batches of the train split the data flags name, in file order."""
    dataset = open_split(cfg, "train")
    path = dataset.source.describe()
    micro = max(1, cfg.data.batch_size // max(1, cfg.pipeline.micro_batches))
    if len(dataset) < micro:
        raise UserError(f"{path}: {len(dataset)} training image(s), fewer than a micro-batch of {micro}")
    samples = [dataset[i] for i in range(min(len(dataset), micro * count) // micro * micro)]
    batches = [
        ([image for image, _ in samples[j : j + micro]], [target for _, target in samples[j : j + micro]])
        for j in range(0, len(samples), micro)
    ]
    instances = sum(len(target["boxes"]) for _, target in samples) / len(samples)
    size = (max(int(image.shape[-2]) for image, _ in samples), max(int(image.shape[-1]) for image, _ in samples))
    what = f"{len(batches)} micro-batch(es) of {path} (mean {instances:.2f} instances per image)"
    return RealBatches(batches, dataset.num_classes, size, math.ceil(instances), what)


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
    for flag, path, writer in (
        ("--write-topology", options.write_topology, write_topology),
        ("--write-values", options.write_values, write_values),
    ):
        if path is None:
            continue
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            writer(Path(path), doc)
        except LauncherError as exc:  # a bug here, but say where rather than crash
            raise UserError(f"{flag} {path}: the recommended topology does not validate: {exc}") from exc
        except ValueError as exc:
            raise UserError(f"{flag} {path}: {exc}") from exc
        except OSError as exc:  # e.g. the disk filled up while measuring
            raise UserError(f"{flag} {path}: cannot write {exc.filename}: {exc.strerror}") from exc
