"""Topology YAML -> validated dataclasses. Every problem is collected, each naming its field (fieldcheck.py).

The format (see launcher/README.md for the full reference):

    engine: pipeline            # pipeline | ddp
    world_size: 3               # optional: checked against the roles
    master: {devices: 0}
    workers:                    # worker i = StatefulSet ordinal i: rank i + 1, rpc name worker<i+1>
      - {devices: 0, stage: stage1, replicas: 1}
      - {devices: 0, stage: stage2, replicas: 1}
    stages:                     # pipeline only, in pipeline order
      - {name: stage1, modules: [transform, backbone]}
      - {name: stage2, modules: [rpn, roi_heads]}
    network: {master_port: 29500, interface: null, transport: auto}
    estimate: {batch_size: 2, image_size: [800, 1333], micro_batches: 2, feature_dtype: float32}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from maskrcnn_launcher.contract import DEFAULT_MASTER_PORT, MODULES, placement_problems
from maskrcnn_launcher.errors import TopologyError
from maskrcnn_launcher.fieldcheck import FieldProblems, as_mapping, is_int, suggest
from maskrcnn_launcher.yamlfile import load_yaml

ENGINES = ("pipeline", "ddp")
# auto (default): device maps on every edge between two GPU stages, host memory elsewhere; device_maps: the
# same, and a topology without GPU workers is an error; cpu: every tensor staged through host memory.
TRANSPORTS = ("auto", "device_maps", "cpu")
FEATURE_DTYPES = ("float32", "bfloat16")
DEFAULT_TOPOLOGY = "three-machines"
_INTERFACE = re.compile(r"^(?!\.{1,2}$)[^/\s]{1,15}$")

# Ceilings of the counts (int_field): far above any real machine or model, low enough that every
# product the plan and the byte estimate take of them stays a finite float.
MAX_DEVICES = 1024  # GPUs on one pod, and replicas of a stage on one worker
MAX_IMAGES = 65_536  # estimate: images per batch
MAX_PIXELS = 65_536  # estimate: image side
MAX_INSTANCES = 100_000  # estimate: instances per image
MAX_PARAMETERS = 10**13  # estimate: model parameters

# torchvision's maskrcnn_resnet50_fpn has 44,401,393 parameters (its weights' metadata); only used
# for ddp's all-reduce byte estimate.
DEFAULT_MODEL_PARAMETERS = 44_401_393


@dataclass(frozen=True)
class Worker:
    index: int
    devices: int
    stage: str | None  # pipeline: the stage this worker holds
    replicas: int  # pipeline: replicas of that stage (one per GPU, or CPU replicas when devices == 0)


@dataclass(frozen=True)
class TopologyStage:
    name: str
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Network:
    master_port: int
    interface: str | None
    transport: str


@dataclass(frozen=True)
class Estimate:
    """Inputs of the byte estimate only: the trainer's own config decides the real run."""

    batch_size: int
    image_size: tuple[int, int]  # (height, width) after the model's resize, before padding to 32
    micro_batches: int
    feature_dtype: str
    instances_per_image: int
    model_parameters: int


@dataclass(frozen=True)
class Topology:
    source: str  # file name, for messages and the plan header
    engine: str
    master_devices: int
    workers: tuple[Worker, ...]
    stages: tuple[TopologyStage, ...]
    network: Network
    estimate: Estimate

    @property
    def nnodes(self) -> int:
        return 1 + len(self.workers)

    def node_devices(self) -> list[int]:
        """GPUs per pod in node-rank order (master first)."""
        return [self.master_devices] + [w.devices for w in self.workers]

    @property
    def world_size(self) -> int:
        if self.engine == "ddp":
            return sum(max(d, 1) for d in self.node_devices())
        return self.nnodes

    def worker_for_stage(self, name: str) -> Worker:
        return next(w for w in self.workers if w.stage == name)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def builtin_topologies() -> list[str]:
    folder = resources.files("maskrcnn_launcher") / "topologies"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_topology_text(ref: str | None) -> tuple[str, str]:
    """(source name, YAML text) for a path, or for a packaged topology's name (e.g. `ddp`)."""
    ref = ref or DEFAULT_TOPOLOGY
    path = Path(ref)
    if path.is_file():
        try:
            return path.name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise TopologyError(
                f"topology {path}: not a text (UTF-8 YAML) file ({exc.reason} at byte {exc.start})"
            ) from exc
        except OSError as exc:
            raise TopologyError(f"topology {path}: cannot read it: {exc.strerror or exc}") from exc
    name = ref.removesuffix(".yaml")
    if "/" not in ref and name in builtin_topologies():
        text = (resources.files("maskrcnn_launcher") / "topologies" / f"{name}.yaml").read_text()
        return f"{name}.yaml", text
    raise TopologyError(
        f"topology: {ref!r} is neither a file nor a packaged topology ({', '.join(builtin_topologies())})"
    )


def load_topology(ref: str | None) -> Topology:
    source, text = read_topology_text(ref)
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise TopologyError(f"{source}: not valid YAML: {exc}") from exc
    return parse_topology(data, source)


def parse_topology(data: Any, source: str = "<topology>") -> Topology:
    """Validate a loaded YAML document; raise `TopologyError` listing every problem."""
    errs = FieldProblems(TopologyError)
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping at the top level")
    errs.keys(data, "", ("engine", "world_size", "master", "workers", "stages", "network", "estimate"))

    engine = data.get("engine", "pipeline")
    if engine not in ENGINES:
        # What the sections must hold depends on the engine: with an unknown one only the engine is wrong.
        errs.add("engine", f"{_suggested(engine)} is not one of {', '.join(ENGINES)}")
        engine = None

    master = as_mapping(data.get("master", {}), "master", errs)
    errs.keys(master, "master", ("devices",))
    master_devices = errs.int_field(master, "devices", "master.devices", default=0, minimum=0, maximum=MAX_DEVICES)
    if engine == "pipeline" and master_devices > 0:
        # The pipeline master holds the data loader and drives the optimizer; stages run on workers.
        errs.add("master.devices", "must be 0 for the pipeline engine (the master holds no stage)")

    workers = _workers(data.get("workers", []), engine, errs)
    stages = _stages(data.get("stages"), engine, errs)
    network = _network(data.get("network", {}), errs)
    estimate = _estimate(data.get("estimate", {}), errs)

    topology = Topology(source, engine or "?", master_devices, tuple(workers), tuple(stages), network, estimate)
    if engine == "pipeline":
        _check_placement(topology, errs)
    elif engine == "ddp":
        kinds = {d > 0 for d in topology.node_devices()}
        if len(kinds) > 1:
            errs.add("workers", "ddp needs every pod with GPUs or every pod without (one backend: nccl or gloo)")
    if "world_size" in data and engine is not None:
        expected = topology.world_size
        if data["world_size"] != expected:
            how = "1 master + workers" if engine == "pipeline" else "sum over pods of max(devices, 1)"
            errs.add("world_size", f"{data['world_size']!r} does not match the roles: {how} = {expected}")
    errs.raise_if_any(source)
    return topology


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def _suggested(engine: Any) -> str:
    return suggest(engine, ENGINES).strip() if isinstance(engine, str) else repr(engine)


def _workers(raw: Any, engine: str | None, errs: FieldProblems) -> list[Worker]:
    """The workers; `engine` None (unknown): their devices only, the engine's own keys unchecked."""
    if not isinstance(raw, list):
        errs.add("workers", "expected a list")
        return []
    workers = []
    for i, item in enumerate(raw):
        where = f"workers[{i}]"
        item = as_mapping(item, where, errs)
        errs.keys(item, where, ("devices", "stage", "replicas"))
        devices = errs.int_field(item, "devices", f"{where}.devices", default=0, minimum=0, maximum=MAX_DEVICES)
        if engine == "ddp":
            for key in ("stage", "replicas"):
                if key in item:
                    errs.add(f"{where}.{key}", "the ddp engine has no stage placements (every pod holds the model)")
            workers.append(Worker(i, devices, None, 1))
            continue
        if engine is None:
            workers.append(Worker(i, devices, None, 1))
            continue
        stage = item.get("stage")
        if stage is None:
            errs.add(f"{where}.stage", "missing: every pipeline worker holds one stage")
        elif not isinstance(stage, str):
            errs.add(f"{where}.stage", f"expected a stage name, got {stage!r}")
            stage = None
        replicas = errs.int_field(item, "replicas", f"{where}.replicas", default=1, minimum=1, maximum=MAX_DEVICES)
        if devices > 0 and replicas > devices:
            errs.add(f"{where}.replicas", f"{replicas} replicas but the worker has {devices} device(s)")
        workers.append(Worker(i, devices, stage, replicas))
    return workers


def _stages(raw: Any, engine: str | None, errs: FieldProblems) -> list[TopologyStage]:
    if engine is None:  # unknown: whether stages belong here at all is the engine's to say
        return []
    if engine == "ddp":
        if raw:
            errs.add("stages", "the ddp engine has no stage placements (every pod holds the model)")
        return []
    if raw is None:
        errs.add("stages", "missing: the pipeline engine needs a stage list")
        return []
    if not isinstance(raw, list) or not raw:
        errs.add("stages", "expected a non-empty list")
        return []
    stages = []
    for i, item in enumerate(raw):
        where = f"stages[{i}]"
        item = as_mapping(item, where, errs)
        errs.keys(item, where, ("name", "modules"))
        name = item.get("name")
        if not isinstance(name, str) or not name:
            errs.add(f"{where}.name", "missing or not a string")
            name = f"<stages[{i}]>"
        modules = item.get("modules")
        if not isinstance(modules, list) or not modules:
            errs.add(f"{where}.modules", "expected a non-empty list of module names")
            modules = []
        for m in modules:
            if m not in MODULES:
                errs.add(f"{where}.modules", f"unknown module{suggest(str(m), MODULES)}")
        stages.append(TopologyStage(name, tuple(str(m) for m in modules)))
    names = [s.name for s in stages]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errs.add("stages", f"stage name {name!r} is defined more than once")
    _check_module_order(stages, errs)
    return stages


def _check_module_order(stages: list[TopologyStage], errs: FieldProblems) -> None:
    """The contract's placement rule, reported under `stages`. Unknown names were reported above with
    a suggestion, and stages left without a known module as non-empty-list errors: neither is
    reported twice."""
    placement = [known for s in stages if (known := [m for m in s.modules if m in MODULES])]
    if not placement:
        return  # every stage is already an error of its own
    for problem in placement_problems(placement):
        errs.add("stages", problem)


def _check_placement(topology: Topology, errs: FieldProblems) -> None:
    known = {s.name for s in topology.stages}
    holders: dict[str, list[int]] = {name: [] for name in known}
    for w in topology.workers:
        if w.stage is None:
            continue
        if w.stage not in known:
            errs.add(f"workers[{w.index}].stage", f"unknown stage{suggest(w.stage, sorted(known))}")
        else:
            holders[w.stage].append(w.index)
    for stage in topology.stages:
        where = holders.get(stage.name, [])
        if not where:
            errs.add("stages", f"stage {stage.name!r} is placed on no worker")
        elif len(where) > 1:
            errs.add("stages", f"stage {stage.name!r} is placed twice (workers {', '.join(map(str, where))})")
    if topology.network.transport == "device_maps":
        if not any(w.devices for w in topology.workers):
            # Maps name CUDA devices: with none, RPC would start with no map and the setting would
            # silently mean "cpu"; say so instead.
            errs.add(
                "network.transport",
                "device_maps needs GPUs: no worker has devices > 0 (TensorPipe device maps move CUDA "
                "tensors); use transport: cpu, or give the stage workers devices",
            )


def _network(raw: Any, errs: FieldProblems) -> Network:
    raw = as_mapping(raw, "network", errs)
    errs.keys(raw, "network", ("master_port", "interface", "transport"))
    port = errs.int_field(
        raw, "master_port", "network.master_port", default=DEFAULT_MASTER_PORT, minimum=1, maximum=65535
    )
    interface = raw.get("interface")
    if interface is not None and (not isinstance(interface, str) or not _INTERFACE.match(interface)):
        # Linux's rule (IFNAMSIZ): at most 15 bytes, no '/' or white space. Whether this host has it is
        # hostcheck.py's, on the pods' host.
        errs.add("network.interface", f"expected an interface name such as eth0, got {interface!r}")
        interface = None
    transport = raw.get("transport", "auto")
    if transport not in TRANSPORTS:
        errs.add("network.transport", f"{transport!r} is not one of {', '.join(TRANSPORTS)}")
    return Network(port, interface, transport)


def _estimate(raw: Any, errs: FieldProblems) -> Estimate:
    raw = as_mapping(raw, "estimate", errs)
    keys = (
        "batch_size",
        "image_size",
        "micro_batches",
        "feature_dtype",
        "instances_per_image",
        "model_parameters",
    )
    errs.keys(raw, "estimate", keys)
    batch = errs.int_field(raw, "batch_size", "estimate.batch_size", default=2, minimum=1, maximum=MAX_IMAGES)
    micro = errs.int_field(
        raw, "micro_batches", "estimate.micro_batches", default=min(2, batch), minimum=1, maximum=MAX_IMAGES
    )
    if micro > batch:
        errs.add("estimate.micro_batches", f"{micro} micro-batches for a batch of {batch} images")
    size = raw.get("image_size", [800, 1333])
    if isinstance(size, int) and not isinstance(size, bool):
        size = [size, size]
    if not (isinstance(size, list) and len(size) == 2 and all(is_int(v) and 0 < v <= MAX_PIXELS for v in size)):
        errs.add("estimate.image_size", f"expected [height, width] in pixels, got {size!r}")
        size = [800, 1333]
    dtype = raw.get("feature_dtype", "float32")
    if dtype not in FEATURE_DTYPES:
        errs.add("estimate.feature_dtype", f"{dtype!r} is not one of {', '.join(FEATURE_DTYPES)}")
    instances = errs.int_field(
        raw, "instances_per_image", "estimate.instances_per_image", default=7, minimum=0, maximum=MAX_INSTANCES
    )
    params = errs.int_field(
        raw,
        "model_parameters",
        "estimate.model_parameters",
        default=DEFAULT_MODEL_PARAMETERS,
        minimum=1,
        maximum=MAX_PARAMETERS,
    )
    return Estimate(batch, (size[0], size[1]), micro, dtype, instances, params)
