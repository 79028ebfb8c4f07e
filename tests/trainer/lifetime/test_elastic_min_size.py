"""--elastic-min-size, the elastic group's policy at work (lifetime/membership.py): the real trainer in a
3-pod `maskrcnn-launch local` job with --elastic-min-size 3. A worker's trainer is SIGKILLed after step 2
and no replacement comes: the two survivors hold at the step boundary with the state saved, then stop
after --elastic-min-wait with one line naming the minimum, every finished step in its checkpoint. (With a
replacement the group goes on at 3: test_elastic_trainer.py, which shares the uninterrupted run; with the
default minimum the survivors go on at 2: its first test.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from maskrcnn_launcher.contract import EXIT_STOPPED

from maskrcnn_dist.checkpoint import latest_checkpoint, load_checkpoint

from .test_elastic_trainer import STEPS, coco, worker_2_killed_after_step_2  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_without_a_replacement_the_group_stops_after_the_wait_every_step_kept(
    tmp_path: Path,
    coco: Path,  # noqa: F811
) -> None:
    running, code, out = worker_2_killed_after_step_2(tmp_path, coco, min_wait=3)
    assert code == EXIT_STOPPED, out[-5000:]
    closing = [line for line in out.splitlines() if line.startswith("[master]") and "stopped by" in line]
    assert len(closing) == 1, closing
    assert "stopped by --elastic-min-size 3: 2 members after waiting 3s for replacements" in closing[0]
    steps = [r["step"] for r in running.records()]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] < STEPS
    assert f"every finished step is in the checkpoint of step {steps[-1]}" in closing[0]
    newest = latest_checkpoint(running.out / "checkpoints")
    assert newest is not None and load_checkpoint(newest)["step"] == steps[-1]
