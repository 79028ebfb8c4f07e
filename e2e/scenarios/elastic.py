"""The elastic ddp JobSet (jobset.elastic.enabled): a worker pod lost mid-epoch is replaced alone by
its Job while the others train on in place, and the JobSet never restarts.

Three pods (master + 2 workers, one CPU rank each, gloo). Mid-epoch worker 2's container is killed
(SIGKILL, no DisruptionTarget: a crash or an OOM kill; a node that goes away is evicted later with
DisruptionTarget, which the chart ignores instead of counting). Its exit 137 counts against the workers'
Job's backoffLimit (workerReplacements), which replaces that pod under the same completion index after
the Job controller's back-off; the survivors go on at world size 2 (docs/elastic.md) and the
replacement joins at a step boundary (3 again). The JobSet completes with `restarts` 0, every step is
recorded once, and the sample record holds every train image exactly once an epoch.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from maskrcnn_launcher.contract import parse_membership_line
from maskrcnn_launcher.status.report import latest_progress

from .. import checks
from ..checks import require
from ..cluster import JobSetController, Pod
from .chart import DDP_CPU_OVERLAY, DDP_VALUES
from .common import RELEASE, Settings, trainer_args
from .deployment import Deployment
from .jobset import check_finished_for_good, jobset_facts

log = logging.getLogger("e2e")

BATCH, WORKERS = 2, 2  # --batch-size per rank; the launch's world is 1 + WORKERS ranks
PER_EPOCH, STEPS = 8, 16  # 48 images in global batches of 3 x 2; two epochs
TRAIN_IMAGES = PER_EPOCH * BATCH * (1 + WORKERS)
KILL_AFTER = 3  # finished steps before the kill: the group is past its start, the epoch far from its end
ELASTIC = {"ddp": {"workers": WORKERS}, "jobset": {"elastic": {"enabled": True}}}
# Every rank writes its own lines of the sample record (samples/rank<r>.jsonl) into the run folder,
# so the workers mount the volume read-write (ddp's default is read-only).
WORKERS_WRITE = {"storage": {"workerMount": "readWrite"}}


def elastic_overlay(steps: int = STEPS) -> dict[str, Any]:
    """The values on top of ci/ddp-values.yaml: 3 CPU pods, jobset.elastic, the small run of `steps`."""
    args = trainer_args(steps, 0, synthetic=False, epochs=steps // PER_EPOCH)
    return {**DDP_CPU_OVERLAY, **ELASTIC, **WORKERS_WRITE, "trainer": {"args": args}}


def _kill_mid_epoch(d: Deployment, js: JobSetController) -> tuple[Pod, float, int]:
    """Once KILL_AFTER steps are recorded: SIGKILL the last worker's container. The pod, when, the step."""

    def trained_enough() -> bool:
        require(js.reconcile() is None, f"the JobSet ended {js.condition} before the kill")
        return checks.last_train_step(d.run_dir) >= KILL_AFTER

    d.wait_until(f"training past step {KILL_AFTER}", trained_enough, 600, poll=0.2)
    victim = js.pods("workers")[-1]
    at_step = checks.last_train_step(d.run_dir)
    killed_at = time.time()
    d.cluster.kill(victim.container)
    require(at_step % PER_EPOCH != 0, f"the kill came at step {at_step}, an epoch's end: not mid-epoch")
    log.info("%s: killed %s after step %d", d.name, victim.spec.host, at_step)
    return victim, killed_at, at_step


def _run_without_restart(d: Deployment, js: JobSetController) -> str:
    """Reconcile until the JobSet has finished; fail at the first group restart."""

    def finished() -> bool:
        state = js.reconcile()
        require(js.restarts == 0 and len(js.attempts) == 1, f"the JobSet restarted the group: {js.events}")
        return state is not None

    d.wait_until("the JobSet finished", finished, 600)
    return js.terminal_state


def _check_replaced(js: JobSetController, victim: Pod) -> Pod:
    """The workers' Job replaced the killed pod once: a new pod, the same index and host, attempt 0."""
    (job,) = [j for j in js.attempt.jobs if j.replicated_job == "workers"]
    require([p.spec.name for p in job.replaced] == [victim.spec.name], f"pods replaced: {job.replaced} ({js.events})")
    require(victim.exit_code == 137, f"the killed worker's pod exited {victim.exit_code}, expected 137 (SIGKILL)")
    new = job.pods[victim.index]
    require(
        new.spec.name != victim.spec.name and new.spec.host == victim.spec.host,
        f"the replacement {new.spec.name} ({new.spec.host}) of {victim.spec.name} ({victim.spec.host})",
    )
    return new


def membership_changes(master_log: str, rank: int) -> dict[str, int]:
    """The master's log, read as `maskrcnn-launch status` reads it: launch rank `rank` lost, then joined
    again, nothing else; at the end the 3 replicas hold the same weights (the replacement got the
    leader's state). The steps the changes came after."""
    same = f"elastic: the {1 + WORKERS} replicas hold the same weights"
    require(same in master_log, f"no '{same}' in the master's log")
    lines = master_log.splitlines()
    progress, note = latest_progress(master_log, "master", len(lines))
    require(progress is not None, f"status reads no progress from the master's log: {note}")
    counts = (progress.lost, progress.left, progress.joined)
    require(counts == (1, 0, 1), f"status counts {counts} ranks lost, left, joined; expected (1, 0, 1)")
    changes = [c for line in lines if (c := parse_membership_line(line))]
    require(
        [(c["event"], c["rank"], c["world_size"]) for c in changes] == [("lost", rank, 2), ("joined", rank, 3)],
        f"membership changes in the master's log: {changes}, expected rank {rank} lost, then joined",
    )
    return {"lost_after_step": changes[0]["step"], "joined_after_step": changes[1]["step"]}


def check_world_sizes(records: list[dict[str, Any]], lost_after: int, joined_after: int) -> list[dict[str, Any]]:
    """The train records by step: world size 3 up to the loss, 2 from the step after it (the one redone),
    3 again after the join. The train records, by step."""
    train = sorted((r for r in records if r.get("kind") == "train"), key=lambda r: int(r["step"]))
    expected = [2 if lost_after < int(r["step"]) <= joined_after else 3 for r in train]
    sizes = [r.get("world_size") for r in train]
    require(
        sizes == expected and 2 in sizes,
        f"world sizes by step {sizes}, expected {expected} (lost after step {lost_after}, joined after {joined_after})",
    )
    return train


def _figures(d: Deployment, records: list[dict[str, Any]], killed_at: float, new: Pod) -> dict[str, float]:
    """Seconds from the kill to the first step recorded on 2 ranks, to the replacement's start, and from
    that start to the end of the last step before its admission (the boundary it joined at)."""
    on_two = [r for r in records if r.get("world_size") == 2]
    started = d.cluster.state(new.container).started_time.timestamp()
    admitted_at = float(on_two[-1]["time"])
    return {
        "kill_to_first_step_on_2_s": round(float(on_two[0]["time"]) - killed_at, 1),
        "kill_to_replacement_started_s": round(started - killed_at, 1),
        "replacement_started_to_admitted_s": round(admitted_at - started, 1),
    }


def scenario_jobset_elastic(settings: Settings) -> dict[str, Any]:
    """JobSet, ddp, jobset.elastic (3 pods): worker 2's container SIGKILLed mid-epoch; the workers' Job
    replaces that pod alone, the survivors train on (world size 3 -> 2), the replacement joins (-> 3),
    the JobSet completes with restarts 0, every step once, every train image once an epoch."""
    with Deployment(settings, "jobset-elastic") as d:
        started = time.monotonic()
        js = d.render_jobset(DDP_VALUES, elastic_overlay(), start=False)
        d.prepare_dataset(train_images=TRAIN_IMAGES)
        js.start()
        victim, killed_at, at_step = _kill_mid_epoch(d, js)
        state = _run_without_restart(d, js)
        require(state == "Completed", f"the JobSet ended {state}: {js.condition} ({js.describe()})")
        exits = check_finished_for_good(d)
        require(exits[f"{RELEASE}-maskrcnn-dist-master-0-0"] == 0, f"the master exited {exits}")
        new = _check_replaced(js, victim)
        changes = membership_changes(d.cluster.logs(js.pods("master")[0].container), rank=1 + victim.index)
        checks.check_one_train_record_per_step(d.run_dir, STEPS)
        checks.check_training_complete(d.run_dir, STEPS)
        records = check_world_sizes(checks.read_records(d.run_dir), *changes.values())
        image_ids = [i["id"] for i in json.loads((d.volume / "synthetic/train/annotations.json").read_text())["images"]]
        checks.check_each_image_once(d.run_dir, image_ids, range(STEPS // PER_EPOCH))
        return {
            **jobset_facts(d, started),
            "killed": victim.spec.host,
            "killed_after_step": at_step,
            "replaced_by": new.spec.name,
            **changes,
            **_figures(d, records, killed_at, new),
            "exit_codes": {**exits, victim.spec.name: victim.exit_code},
        }
