"""Processes of the multi-process pipeline tests: `python pipeline_procs.py ROLE ARGS_JSON`.

A worker serves its stage (train()'s worker path). The master runs a scenario and writes what
it measured to OUT/result.pt for the test to check; train()'s master path trains for real. Every process
runs with tripwires on RRefs, distributed autograd and the distributed optimizer (tripwires.py), its
record in OUT/tripwires/ROLE-INDEX.log. The master also lists every RPC call it makes, callee and
function, one a line, in OUT/calls-master.log (record_calls).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLACEMENT = (("transform", "backbone"), ("rpn", "roi_heads"))


def make_plans(port: int, placement=PLACEMENT, replicas=(1, 1)):
    """(master, workers): the PodPlans the launcher itself derives for a CPU master and one worker per
    stage on localhost (CPU replicas when a worker has no devices)."""
    from maskrcnn_launcher.plan import derive_job
    from maskrcnn_launcher.topology import parse_topology

    topology = parse_topology(
        {
            "engine": "pipeline",
            "workers": [{"devices": 0, "stage": f"stage{i + 1}", "replicas": r} for i, r in enumerate(replicas)],
            "stages": [{"name": f"stage{i + 1}", "modules": list(names)} for i, names in enumerate(placement)],
        },
        "<pipeline tests>",
    )
    job = derive_job(topology, "127.0.0.1", port)
    return job.pods[0], list(job.pods[1:])


def spawn(role: str, args: dict, log_dir: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        # HERE.parent: reference.py, shared with the ddp tests
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    log = open(log_dir / f"{role}-{args.get('index', 0)}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [sys.executable, str(Path(__file__)), role, json.dumps(args)], env=env, stdout=log, stderr=subprocess.STDOUT
    )


def stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait(timeout=30)


def record_calls(record: Path) -> None:
    """Append "CALLEE FUNCTION" to `record` for each rpc_sync/rpc_async this process makes, in order."""
    import functools

    import torch.distributed.rpc as rpc

    def wired(original):
        @functools.wraps(original)
        def call(to, func, *args, **kwargs):
            with open(record, "a") as out:
                out.write(f"{getattr(to, 'name', to)} {getattr(func, '__name__', func)}\n")
            return original(to, func, *args, **kwargs)

        return call

    record.write_text("")
    for name in ("rpc_sync", "rpc_async"):
        setattr(rpc, name, wired(getattr(rpc, name)))


def _config(args: dict):
    from pipeline_toy import small_config

    cfg = small_config(
        micro_batches=args.get("micro_batches", 4), peer_timeout=args.get("rpc_timeout", 20.0), size=args["size"]
    )
    if "output_dir" in args:
        cfg = replace(cfg, output_dir=Path(args["output_dir"]))
    return cfg


def worker_main(args: dict) -> None:
    from maskrcnn_dist.train import train

    _, workers = make_plans(args["port"], replicas=tuple(args.get("replicas", (1, 1))))
    train(_config(args), workers[args["index"]])


def master_main(args: dict) -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    import pipeline_scenarios

    record_calls(Path(args["out"]) / "calls-master.log")

    from maskrcnn_dist.errors import TrainingError

    try:
        getattr(pipeline_scenarios, args["scenario"])(args, _config(args))
    except TrainingError as exc:  # as the CLI does: one line, exit 1
        print(f"error: {exc}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    role, raw = sys.argv[1], json.loads(sys.argv[2])
    import tripwires

    tripwires.install(Path(raw["out"]) / "tripwires" / f"{role}-{raw.get('index', 0)}.log")
    started = time.time()
    {"worker": worker_main, "master": master_main}[role](raw)
    print(f"{role} done in {time.time() - started:.1f}s", flush=True)
