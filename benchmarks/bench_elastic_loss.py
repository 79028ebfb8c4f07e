"""What a lost ddp worker costs the real trainer: in place (--elastic) beside today's restart from the
newest checkpoint, measured in one run (docs/elastic.md, docs/performance.md).

    .venv/bin/python benchmarks/bench_elastic_loss.py [--kill-after 6] [--checkpoint-period 4] [--json F]

Both jobs are `maskrcnn-launch local` with a 3-pod ddp topology (a master and two workers, one CPU rank
each, on loopback), the small model at 64 px, the same data and schedule; worker 2's trainer is SIGKILLed
once the master has recorded step --kill-after:
  in place   --elastic: the survivors form a group of 2 and go on;
  restart    --no-elastic: the job ends (exit 1), and is started again whole with --resume auto, as a JobSet
             restart would (minus the pods' scheduling and the image pull), from the newest checkpoint
             (--checkpoint-period steps apart).
For each: seconds from the kill to the first step finished after it (by the master's train records),
finished steps lost (done again), the step time before the kill, and the images/s of 2 ranks beside 3
(in place). A third run, in place with --restart-workers 1, gives the replacement's admission: seconds
from its asking to join to the step boundary that admits it.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from local_job import THREE_CPU_PODS, LocalJob  # noqa: E402

from maskrcnn_dist.config import small_cpu_run, to_argv  # noqa: E402
from maskrcnn_dist.data import write_train_val  # noqa: E402

GLOBAL_BATCH = 6  # the launch's 3 ranks x --batch-size 2
LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def start_job(work: Path, data: Path, out: Path, *extra: str, local: tuple[str, ...] = ()) -> LocalJob:
    """One `maskrcnn-launch local` job of the 3-pod topology, 4 epochs of `data` (a restart's resume drops
    the records after its checkpoint from the file)."""
    flags = small_cpu_run(64, data_path=data, output_dir=out, epochs=4, batch_size=2, threads=1, workers=0)
    flags |= {"warmup-iters": 5, "aspect-ratio-group-factor": -1, "print-freq": 1, "rpc-timeout": 60}
    flags |= {"eval-every-epoch": False}  # validation at each epoch end only: the loss is the figure
    return LocalJob(work, out, THREE_CPU_PODS, [*to_argv(flags), *extra], local)


def step_seconds(records: list[dict[str, Any]]) -> float:
    times = [r["time"] for r in records]
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def global_images_per_s(records: list[dict[str, Any]]) -> float:
    """Images of the global batch (3 ranks x 2) per second of the median step among consecutive `records`."""
    return GLOBAL_BATCH / step_seconds(records)


def in_place(work: Path, data: Path, kill_after: int) -> dict[str, float]:
    job = start_job(work, data, work / "in-place", "--elastic")
    before = job.wait_for_step(kill_after, 600)
    killed = job.kill_trainer(2)
    after = job.wait_for(lambda rs: any(r.get("world_size") == 2 for r in rs), 600)
    code = job.finish()
    records = job.records()
    first = next(r for r in after if r.get("world_size") == 2)
    last_before = max(r["step"] for r in records if r["time"] <= killed)
    # The global batch (6 images) over the step's wall time: a record's images_per_s assumes equal shares.
    three = global_images_per_s([r for r in records if r.get("world_size") == 3 and r["step"] > 2])
    two = global_images_per_s([r for r in records if r.get("world_size") == 2][1:])
    return {
        "exit": code,
        "kill_to_first_step_s": first["time"] - killed,
        "steps_lost": last_before + 1 - first["step"],
        "step_s": step_seconds(before[2:]),
        "images_per_s_3": three,
        "images_per_s_2": two,
        "steps_recorded_once": float([r["step"] for r in records] == list(range(1, len(records) + 1))),
    }


def restart(work: Path, data: Path, kill_after: int, period: int) -> dict[str, float]:
    out = work / "restart"
    job = start_job(work, data, out, "--no-elastic", "--checkpoint-period", str(period))
    before = job.wait_for_step(kill_after, 600)
    killed = job.kill_trainer(2)
    first_code = job.finish()
    last_before = max(r["step"] for r in job.records() if r["time"] <= killed)
    again = start_job(work, data, out, "--no-elastic", "--checkpoint-period", str(period), "--resume", "auto")
    after = again.wait_for(lambda rs: any(r["time"] > killed and r["step"] <= last_before + 1 for r in rs), 600)
    first = min((r for r in after if r["time"] > killed), key=lambda r: r["time"])
    code = again.finish()
    return {
        "exit": code,
        "first_exit": first_code,
        "kill_to_first_step_s": first["time"] - killed,
        "steps_lost": last_before + 1 - first["step"],
        "step_s": step_seconds(before[2:]),
    }


def rejoin(work: Path, data: Path, kill_after: int) -> dict[str, float]:
    """Seconds from the replacement asking in to the boundary that admits it, and the step time then."""
    job = start_job(work, data, work / "rejoin", "--elastic", local=("--restart-workers", "1"))
    job.wait_for_step(kill_after, 600)
    job.kill_trainer(2)
    code = job.finish()
    log = job.output()
    asked = _log_time(log, "asks to join")
    joined = _log_time(log, "joined after step")
    return {"exit": code, "asked_to_admitted_s": joined - asked, "step_s": step_seconds(job.records()[2:])}


def _log_time(log: str, words: str) -> float:
    line = next(line for line in log.splitlines() if words in line)
    stamp = LOG_TIME.search(line)
    assert stamp is not None, line
    return time.mktime(time.strptime(stamp.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp.group(1)[20:]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-after", type=int, default=6, help="the master's recorded step at the kill")
    parser.add_argument("--checkpoint-period", type=int, default=4, help="restart: steps between checkpoints")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-elastic-loss-") as tmp:
        work = Path(tmp)
        write_train_val(work / "coco", num_train=24, num_val=3, seed=5, image_size=(48, 64), max_objects=2)
        place = in_place(work, work / "coco", args.kill_after)
        again = restart(work, work / "coco", args.kill_after, args.checkpoint_period)
        back = rejoin(work, work / "coco", args.kill_after)
    kill_s = (place["kill_to_first_step_s"], again["kill_to_first_step_s"])
    rejoined = f"{back['asked_to_admitted_s']:.2f} s (steps of {back['step_s']:.2f} s)"
    rows = [
        ("kill to the first finished step", *(f"{s:.2f} s" for s in kill_s)),
        ("finished steps lost (done again)", f"{place['steps_lost']:g}", f"{again['steps_lost']:g}"),
        ("step time before the kill", f"{place['step_s']:.2f} s", f"{again['step_s']:.2f} s"),
        ("job exit", f"{place['exit']:g}", f"{again['first_exit']:g}, then {again['exit']:g}"),
        ("images/s on 3 ranks, then on 2", f"{place['images_per_s_3']:.2f}, {place['images_per_s_2']:.2f}", "-"),
        ("replacement: asked to join -> admitted", rejoined, "-"),
    ]
    report = {"in_place": place, "restart": again, "rejoin": back, "host": common.cpu_isa()}
    lost_at, period = (
        f"worker lost after step {args.kill_after}",
        f"restart (checkpoint every {args.checkpoint_period})",
    )
    header = (lost_at, "in place (--elastic)", period)
    common.emit(common.render_table(header, rows, right_from=1), report, args.json)


if __name__ == "__main__":
    main()
