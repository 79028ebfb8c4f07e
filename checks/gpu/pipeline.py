"""The pipeline engine's checks: the master and two stage workers through the launcher, on the one GPU,
against the local engine with the same flags, every bound a multiple of a measured noise floor.

- The floor, measured first: the local engine twice from the same seed (CUDA's kernels are not
  deterministic: RoIAlign's backward adds with atomics), the largest difference of the losses
  (relative) and of the final weights (absolute). A floor under `MIN_FLOOR` counts as `MIN_FLOOR`: on
  CPU the runs are bitwise equal, and the pipeline may still sum in its own order.
- `pipeline_device_maps`: three processes on one GPU with TensorPipe device maps cuda:0 -> cuda:0 both
  ways (activations forward, their gradients back, as CUDA tensors in plain RPC calls; two processes on
  one device is what TensorPipe's cuda_ipc channel takes), M=1, against the local engine within
  `FLOOR_MULTIPLE` floors. TensorPipe's own log names the
  channels that carried tensors (`channels`; `cuda_channel` for the CUDA tensors); every process runs
  under the device-map guard.
- `pipeline_streams`: the same run with CUDA_LAUNCH_BLOCKING=1 (every kernel finishes before the host goes
  on, so no stream can overtake another) agrees with the device-map run within the same bound: a missing
  wait between a replica's stream and RPC's would show as a difference here.
- `pipeline_amp` (pipeline_amp.py): fp16 and bf16 stages against the local engine's same --amp run.
- `pipeline_cpu`: the same with `transport: cpu` (stage outputs staged through host memory); its step
  time and bytes per link beside the device-map run's.
- `pipeline_replicas`: 2 replicas of stage 2 where the topology allows it (a GPU each); with one GPU
  the launcher's own topology check says why not.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .harness import CheckFailed, Env, needs_cuda, needs_two_gpus
from .runs import base_flags, final_checkpoint, max_abs_diff, run_logged, train_local_run, train_losses

# How far the pipeline may be from the local engine, in floors.
FLOOR_MULTIPLE = 4.0
MIN_FLOOR = 2.5e-6
FLOOR_FILE = "pipeline-floor.json"
# TensorPipe logs every tensor a channel sends at verbosity 4: "Channel <pipe id>.ch_<name> received a send request".
CHANNEL_SEND = re.compile(r"Channel \S+?\.ch_([a-z_]+?)(?:_\d+)? received a send request")
GUARD = {"MASKRCNN_DEVICE_MAP_GUARD": "1"}


def pipeline_topology(gpus: tuple[int, int], replicas: tuple[int, int], transport: str) -> dict[str, Any]:
    return {
        "engine": "pipeline",
        "master": {"devices": 0},
        "workers": [
            {"devices": gpus[0], "stage": "stage1", "replicas": replicas[0]},
            {"devices": gpus[1], "stage": "stage2", "replicas": replicas[1]},
        ],
        "stages": [
            {"name": "stage1", "modules": ["transform", "backbone"]},
            {"name": "stage2", "modules": ["rpn", "roi_heads"]},
        ],
        "network": {"transport": transport},
    }


# -- the floor and the comparison -------------------------------------------------------------------


def noise_floor(env: Env) -> dict[str, Any]:
    """The local engine twice from the same seed: how far the device alone moves losses and weights.
    Measured once per run of the check (cached in the work folder for the other pipeline checks)."""
    cached = Path(env.work) / FLOOR_FILE
    if cached.is_file():
        return json.loads(cached.read_text())
    # On CPU with the stage workers' one thread: the same summation order as theirs.
    threads = 1 if env.device == "cpu" else None
    first, second = (
        train_local_run(base_flags(env, env.data, Path(env.work) / f"local-{k}", threads=threads)) for k in "ab"
    )
    floor = {**differences(first, second), "local": str(first)}
    cached.write_text(json.dumps(floor))
    return floor


def differences(run: Path, reference: Path) -> dict[str, float]:
    """The largest relative difference of two runs' training losses and absolute of their final weights."""
    got, expected = train_losses(run / "metrics.jsonl"), train_losses(reference / "metrics.jsonl")
    if sorted(got) != sorted(expected) or not got:
        raise AssertionError(f"steps differ: {run.name} {sorted(got)}, {reference.name} {sorted(expected)}")
    loss = max(abs(got[s] - expected[s]) / max(abs(expected[s]), 1e-12) for s in got)
    weights = max_abs_diff(final_checkpoint(run)["model"], final_checkpoint(reference)["model"])
    return {"loss": float(f"{loss:.3g}"), "weights": float(f"{weights:.3g}")}


def within_floor(what: str, diff: dict[str, float], floor: dict[str, Any], figures: dict[str, Any]) -> None:
    """CheckFailed (keeping `figures`) unless each difference is within FLOOR_MULTIPLE floors."""
    for key in ("loss", "weights"):
        bound = FLOOR_MULTIPLE * max(floor[key], MIN_FLOOR)
        figures[f"{key}_in_floors"] = round(diff[key] / max(floor[key], MIN_FLOOR), 2)
        if diff[key] > bound:
            raise CheckFailed(
                f"{what}: {key} differ by {diff[key]:.3g}, over {FLOOR_MULTIPLE:g} floors ({bound:.3g}; the local "
                f"engine against itself: {floor[key]:.3g})",
                figures,
            )


# -- one pipeline run --------------------------------------------------------------------------------


def launch(
    env: Env, name: str, transport: str, replicas: int = 1, flags: dict[str, Any] | None = None, **variables: str
) -> tuple[Path, str]:
    """`maskrcnn-launch local` of the pipeline on this machine with the topology's transport, under the
    device-map guard; its output folder and log. M = replicas (each replica needs a micro-batch). `flags`:
    more training flags (the same ones the local run it is compared with gets)."""
    from maskrcnn_launcher.peers import free_port

    from maskrcnn_dist.config import to_argv

    gpus = 1 if env.device == "cuda" else 0
    work = Path(env.work) / name
    work.mkdir(parents=True, exist_ok=True)
    topology = work / "topology.yaml"
    topology.write_text(json.dumps(pipeline_topology((gpus, gpus * replicas), (1, replicas), transport)))
    flags = base_flags(env, env.data, work / "pipeline", micro_batches=replicas, rpc_timeout=60, **(flags or {}))
    flags.pop("threads", None)  # stage workers take 1 thread each (perf.setup_process)
    # The master holds no model (the stages use the topology's devices); "auto", as --amp-dtype float16
    # is refused with --device cpu.
    flags["device"] = "auto"
    command = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(topology)]
    command += ["--master-port", str(free_port()), "--wait-timeout", "60", "--grace", "5", "--", *to_argv(flags)]
    log = run_logged(command, work / "launch.log", 300, threads=1, **GUARD, **variables)
    return work / "pipeline", log


def train_records(output: Path) -> list[dict[str, Any]]:
    from maskrcnn_dist.training.metrics import read_metrics

    metrics = output / "metrics.jsonl"
    return [r for r in read_metrics(metrics) if r["kind"] == "train"] if metrics.is_file() else []


def step_figures(output: Path) -> dict[str, Any]:
    """The last step's time and bytes per link, from the master's train records."""
    last = train_records(output)[-1]
    links = {k.removeprefix("link/"): int(v) for k, v in last.items() if k.startswith("link/")}
    return {"step_s": round(last["pipeline/step_s"], 3), "bytes_per_link": links}


def channels(log: str) -> dict[str, int]:
    """Tensors sent per TensorPipe channel, from its verbose log."""
    return dict(Counter(CHANNEL_SEND.findall(log)))


def gathered_loads(env: Env, output: Path) -> None:
    """The master's checkpoint (every stage's part) loads into the local engine."""
    from maskrcnn_dist.data import load_datasets
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    from .runs import train_config

    cfg = train_config(base_flags(env, env.data, output.parent / "gathered"))
    train_set, _ = load_datasets(cfg)
    TorchEngine(cfg, train_set.num_classes, iters_per_epoch=1).load_state_dict(final_checkpoint(output))


# -- the checks -------------------------------------------------------------------------------------------


def check_device_maps(env: Env) -> dict[str, Any]:
    floor = noise_floor(env)
    output, log = launch(env, "pipeline_device_maps", "device_maps", TP_VERBOSE_LOGGING="4")
    used = channels(log)
    cuda = sorted(name for name in used if name.startswith("cuda"))
    figures: dict[str, Any] = {
        "floor": {k: floor[k] for k in ("loss", "weights")},
        **differences(output, Path(floor["local"])),
        "cuda_channel": ", ".join(cuda) or None,
        "channels": used,
        **step_figures(output),
    }
    if not cuda:
        raise CheckFailed(
            f"no CUDA tensor crossed a CUDA channel (TensorPipe's channels: {used or 'none logged'})", figures
        )
    within_floor("device maps against the local engine", figures, floor, figures)
    gathered_loads(env, output)
    figures["headline"] = (
        f"M=1 vs local: loss x{figures['loss_in_floors']}, weights x{figures['weights_in_floors']} floors; "
        f"channel {figures['cuda_channel']}; step {figures['step_s']} s"
    )
    return figures


def check_streams(env: Env) -> dict[str, Any]:
    """The device-map run again with every kernel finishing before the host goes on."""
    floor = noise_floor(env)
    reference = Path(env.work) / "pipeline_device_maps" / "pipeline"
    if not train_records(reference):
        raise AssertionError("no device-map run to compare with (pipeline_device_maps did not run)")
    output, _ = launch(env, "pipeline_streams", "device_maps", CUDA_LAUNCH_BLOCKING="1")
    figures: dict[str, Any] = {
        **differences(output, reference),
        "against_local": differences(output, Path(floor["local"])),
    }
    within_floor("CUDA_LAUNCH_BLOCKING=1 against the device-map run", figures, floor, figures)
    figures["headline"] = (
        f"blocking vs device maps: loss x{figures['loss_in_floors']}, weights x{figures['weights_in_floors']} floors"
    )
    return figures


def check_cpu_transport(env: Env) -> dict[str, Any]:
    floor = noise_floor(env)
    output, _ = launch(env, "pipeline_cpu", "cpu")
    figures: dict[str, Any] = {
        "floor": {k: floor[k] for k in ("loss", "weights")},
        **differences(output, Path(floor["local"])),
        **step_figures(output),
    }
    device_maps = Path(env.work) / "pipeline_device_maps" / "pipeline"
    if train_records(device_maps):  # the device-map run, when it trained
        figures["device_maps"] = step_figures(device_maps)
        figures["device_maps_speedup"] = round(figures["step_s"] / max(figures["device_maps"]["step_s"], 1e-9), 2)
    within_floor("transport cpu against the local engine", figures, floor, figures)
    gathered_loads(env, output)
    against = f", device maps {figures['device_maps']['step_s']} s" if "device_maps" in figures else ""
    figures["headline"] = (
        f"M=1 vs local: loss x{figures['loss_in_floors']}, weights x{figures['weights_in_floors']} floors; "
        f"step {figures['step_s']} s{against}"
    )
    return figures


def check_replicas(env: Env) -> dict[str, Any]:
    """2 replicas of stage 2, M=2: the first loss within the M>1 tolerance of the CPU tests (M=2 normalises
    the samplers per micro-batch, so it is not the local engine's step), replicas equal (the checkpoint is
    written only then), and the gathered checkpoint loads."""
    output, _ = launch(env, "pipeline_replicas", "device_maps", replicas=2)
    pipe = train_losses(output / "metrics.jsonl")
    local = train_losses(Path(noise_floor(env)["local"]) / "metrics.jsonl")
    first = min(pipe)
    if abs(pipe[first] - local[first]) > max(0.25 * abs(local[first]), 0.05):
        raise AssertionError(f"first loss {pipe[first]:.4f} vs local {local[first]:.4f} (M>1 tolerance)")
    gathered_loads(env, output)
    return {"first_loss": round(pipe[first], 4), "local_first_loss": round(local[first], 4), **step_figures(output)}


def needs_device_maps(env: Env) -> str | None:
    return needs_cuda(env)


def needs_replica_devices(env: Env) -> str | None:
    """Why 2 replicas of a stage cannot run here: on CPU, no GPU; on the GPUs at hand, what the launcher's
    own topology check refuses (one replica per GPU: replica r runs on cuda:r)."""
    if env.device != "cuda":
        return needs_two_gpus(env)
    from maskrcnn_launcher.errors import TopologyError
    from maskrcnn_launcher.topology import parse_topology

    gpus = min(env.gpus, 2)
    try:
        parse_topology(pipeline_topology((gpus, gpus), (1, 2), "device_maps"), "<2 replicas of stage2>")
    except TopologyError as exc:
        return f"the topology refuses 2 replicas of stage 2 on {env.gpus} GPU(s): {' '.join(str(exc).split())}"
    return None
