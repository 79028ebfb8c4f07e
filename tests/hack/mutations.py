"""The suite's teeth: known breaks of the code, each applied in turn, and the tests that must catch it.

    python tests/hack/mutations.py list
    python tests/hack/mutations.py run [--only NAME,...] [--json OUT]

Each mutation is a break an earlier round's note named, with the test files that caught it then.
`run` applies one (exact text edits in the code; the file is put back afterwards, also on Ctrl-C), runs
those files (-x: the first failure is enough), and says which test failed. A mutation that nothing
catches, or whose text is no longer in the code (the code moved: update the edit), fails the run.
The suite keeps its power when every mutation is caught after a change that cut or merged tests
(issue 54). Run it from the repository root with the venv's python; it takes about half an hour.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_test_marks() -> str:
    """The mark expression `make test` runs with: the Makefile's TEST_MARKS default."""
    found = re.search(r"^TEST_MARKS \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit("Makefile: no `TEST_MARKS ?= ...` line")
    return found.group(1).strip()


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file in the repository, text, its replacement)
    tests: tuple[str, ...]  # the test files (or node ids) that must catch it


MUTATIONS = (
    Mutation(
        "the loss weight ignored in backward",
        (
            (
                "src/maskrcnn_dist/engines/torch_engine.py",
                "self.scaler.scale(loss if scale == 1.0 else loss * scale)",
                "self.scaler.scale(loss)",
            ),
        ),
        ("tests/trainer/engines/test_accumulation.py",),
    ),
    Mutation(
        "optimizer.step() instead of scaler.step",
        (
            (
                "src/maskrcnn_dist/engines/torch_engine.py",
                "self.scaler.step(self.optimizer)  # fused",
                "self.optimizer.step()  # fused",
            ),
        ),
        ("tests/trainer/test_scaler.py",),
    ),
    Mutation(
        "gradients clipped before they are unscaled",
        (("src/maskrcnn_dist/engines/torch_engine.py", "            self.scaler.unscale_(self.optimizer)\n", ""),),
        ("tests/trainer/test_scaler.py",),
    ),
    Mutation(
        "a .tolist() back in the local step",
        (
            (
                "src/maskrcnn_dist/engines/torch_engine.py",
                "        logged = self._mean_over_ranks(weighted)\n",
                "        logged = self._mean_over_ranks(weighted)\n        [v.tolist() for v in logged.values()]\n",
            ),
        ),
        ("tests/trainer/test_step_reads.py",),
    ),
    Mutation(
        "no fillers for a rank short of micro-batches",
        (("src/maskrcnn_dist/data/plan.py", "for i in range(rounds - len(mine))]", "for i in range(0)]"),),
        ("tests/trainer/engines/test_world_size.py", "tests/trainer/data"),
    ),
    Mutation(
        "the uncommitted sample lines not dropped in a new generation",
        (
            (
                "src/maskrcnn_dist/training/elastic_loop.py",
                "self.sample_record.drop_after(self.position.step, every_rank=True)",
                "pass",
            ),
            (
                "src/maskrcnn_dist/training/elastic_loop.py",
                "self.sample_record.drop_after(self.position.step, every_rank=False)",
                "pass",
            ),
        ),
        ("tests/trainer/lifetime/test_elastic_trainer.py",),
    ),
    Mutation(
        "the newcomer not loading the leader's state",
        (
            (
                "src/maskrcnn_dist/lifetime/elastic.py",
                "return transfer.receive(generation.rank_of(LEADER)) if self.me in self.newcomers else state",
                "return (transfer.receive(generation.rank_of(LEADER)), state)[1]"
                " if self.me in self.newcomers else state",
            ),
        ),
        ("tests/trainer/lifetime/test_elastic.py", "tests/trainer/lifetime/test_elastic_trainer.py"),
    ),
    Mutation(
        "the minimum group size ignored",
        (("src/maskrcnn_dist/lifetime/membership.py", "return size >= policy.min_size", "return True"),),
        ("tests/trainer/lifetime/test_policy.py", "tests/trainer/lifetime/test_elastic_min_size.py"),
    ),
    Mutation(
        "an admission keyed by the member, not single-use",
        (
            (
                "src/maskrcnn_dist/lifetime/membership.py",
                "        if newest[member] != ticket:\n",
                "        if False:\n",
            ),
        ),
        ("tests/trainer/lifetime/test_policy.py", "tests/trainer/lifetime/test_elastic_replaced.py"),
    ),
    Mutation(
        "a lambda in a stage host passes the device-map guard",
        (
            (
                "src/maskrcnn_dist/engines/pipeline/guard.py",
                "        tensors = _extract_tensors(value)\n",
                "        return\n",
            ),
        ),
        ("tests/trainer/engines/pipeline/test_guard.py",),
    ),
    Mutation(
        "a stage that zeroes its incoming gradient",
        (("src/maskrcnn_dist/engines/pipeline/host.py", "(o, g.to(o.device, o.dtype))", "(o, torch.zeros_like(o))"),),
        (
            "tests/trainer/engines/pipeline/test_pipeline_inprocess.py",
            "tests/trainer/engines/pipeline/test_pipeline_mp.py",
        ),
    ),
    Mutation(
        "one fewer warm-up forward in 1F1B",
        (
            (
                "src/maskrcnn_dist/engines/pipeline/schedule.py",
                "warmup = min(micro_batches, stages - stage)",
                "warmup = min(micro_batches, stages - stage - 1)",
            ),
        ),
        ("tests/trainer/engines/pipeline/test_schedule.py",),
    ),
    Mutation(
        "URL_FIELDS = ()",
        (
            (
                "src/maskrcnn_dist/data/annotations/image_names.py",
                'URL_FIELDS = ("coco_url", "url", "image_url")',
                "URL_FIELDS = ()",
            ),
        ),
        ("tests/trainer/data",),
    ),
    Mutation(
        "the run lock a nullcontext",
        (
            (
                "src/maskrcnn_dist/run_lock.py",
                "    fd = _acquire(output_dir, command, wait_for_other_host_s, sleep, made)\n",
                "    fd = None\n",
            ),
        ),
        ("tests/trainer/test_run_lock.py",),
    ),
    Mutation(
        "the sampler's positive cap off by one",
        (
            (
                "src/maskrcnn_dist/modeling/batched/sampler.py",
                "positive_cap = int(batch_size_per_image * positive_fraction)",
                "positive_cap = int(batch_size_per_image * positive_fraction) + 1",
            ),
        ),
        ("tests/trainer/batched",),
    ),
    Mutation(
        "the box check reading once per image",
        (
            (
                "src/maskrcnn_dist/modeling/batched/model.py",
                "    if not boxes or not bool((torch.cat(boxes)[:, 2:] <= torch.cat(boxes)[:, :2]).any()):\n"
                "        return\n",
                "    if not boxes or not any([bool((b[:, 2:] <= b[:, :2]).any()) for b in boxes]):\n        return\n",
            ),
        ),
        ("tests/trainer/test_step_reads.py",),
    ),
    Mutation(
        "the parse-ahead lock file left in the temporary folder",
        (
            (
                "src/maskrcnn_dist/data/parse_ahead.py",
                "            os.unlink(cache.ahead_lock_path())\n",
                "            pass\n",
            ),
        ),
        ("tests/trainer/data/test_parse_ahead.py",),
    ),
    Mutation(
        "a data-check reader forked with the trainer's signal handlers live",
        (
            (
                "src/maskrcnn_dist/data/check_ahead.py",
                "blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING)",
                "blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set())",
            ),
        ),
        ("tests/trainer/data/test_check_ahead.py",),
    ),
    Mutation(
        "a progress poster whose final post timed out keeps its thread",
        (
            (
                "src/maskrcnn_dist/training/progress_post.py",
                "self._take_pending()  # not posted, now never",
                "return  # not posted, now never",
            ),
        ),
        ("tests/trainer/test_progress_post.py",),
    ),
    Mutation(
        "the amp check's steps taking their own proposals",
        (
            (
                "checks/gpu/amp.py",
                "taken.extend(b.detach() for b in (boxes if proposals is None else proposals))",
                "taken.extend(b.detach() for b in boxes)",
            ),
        ),
        ("tests/trainer/test_amp_check.py",),
    ),
    Mutation(
        "--box-batch-size-per-image not reaching the model",
        (
            (
                "src/maskrcnn_dist/modeling/model.py",
                '        kwargs["box_batch_size_per_image"] = cfg.box_batch_size_per_image\n',
                "        pass\n",
            ),
        ),
        ("tests/trainer/batched/test_model.py",),
    ),
    Mutation(
        "--detections-per-image not reaching the model",
        (
            (
                "src/maskrcnn_dist/modeling/model.py",
                '        kwargs["box_detections_per_img"] = cfg.detections_per_image\n',
                "        pass\n",
            ),
        ),
        ("tests/trainer/batched/test_model.py::test_evaluation_keeps_the_detections_it_is_told_to",),
    ),
    Mutation(
        "the watcher counting its own stall as every member's silence",
        (
            (
                "src/maskrcnn_dist/lifetime/watcher.py",
                "        return min(seconds, self._max_gap_s)\n",
                "        return seconds\n",
            ),
        ),
        ("tests/trainer/lifetime/test_watcher.py",),
    ),
    Mutation(
        "a watcher that lost the store keeps its peers' silence capped",
        (("src/maskrcnn_dist/lifetime/watcher.py", "                self._store_lost.set()\n", ""),),
        ("tests/trainer/lifetime/test_watcher.py",),
    ),
    Mutation(
        "a replacement that finds the run over leaves its watcher beating",
        (("src/maskrcnn_dist/lifetime/elastic.py", "            self.watcher.close()\n", "            pass\n"),),
        ("tests/trainer/lifetime/test_elastic.py::test_a_replacement_that_finds_the_run_over_closes_its_watcher",),
    ),
    Mutation(
        "the zygote's proxy keeps the signals it is sent",
        (("tests/zygote_site/sitecustomize.py", "            os.kill(pid, signum)\n", "            pass\n"),),
        ("tests/test_zygote.py::test_a_signal_to_the_proxy_reaches_the_program_and_its_exit_comes_back",),
    ),
    Mutation(
        "a forked trainer without its parent's signal mask (torchrun's blocked stop forward)",
        (("tests/zygote.py", '    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])\n', ""),),
        ("tests/test_zygote.py::test_the_program_inherits_the_signal_mask_and_the_ignored_signals",),
    ),
)


def stale(mutation: Mutation) -> list[str]:
    """What no longer fits the code, read without writing: edits whose text is not in its file exactly once
    (applied in order), test paths that are gone."""
    found, texts = [], {}
    for name, old, new in mutation.edits:
        path = ROOT / name
        text = texts.setdefault(path, path.read_text() if path.exists() else "")
        if text.count(old) != 1:
            found.append(f"{name}: the text to break is there {text.count(old)} times, not once: {old!r}")
        texts[path] = text.replace(old, new)
    found += [f"{test}: no such test file" for test in mutation.tests if not (ROOT / test.split("::")[0]).exists()]
    return found


def apply(mutation: Mutation) -> dict[Path, str]:
    """The mutation's edits written; returns each touched file's original text. Raises LookupError when an
    edit's text is not in its file exactly once."""
    originals: dict[Path, str] = {}
    for name, old, new in mutation.edits:
        path = ROOT / name
        text = path.read_text()
        originals.setdefault(path, text)
        if text.count(old) != 1:
            restore(originals)
            raise LookupError(f"{name}: the text to break is there {text.count(old)} times, not once: {old!r}")
        path.write_text(text.replace(old, new))
    return originals


def restore(originals: dict[Path, str]) -> None:
    for path, text in originals.items():
        path.write_text(text)


def caught_by(mutation: Mutation, timeout_s: float) -> tuple[str, float]:
    """The first test that failed with `mutation` applied ("" when none), and the seconds it took."""
    started = time.monotonic()
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rf"]
    argv += ["-o", "addopts=", "-m", make_test_marks(), *mutation.tests]  # what `make test` would catch it with
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "(timed out: count as caught only after a look)", time.monotonic() - started
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE)
    if done.returncode == 0 or not failed:
        return "", time.monotonic() - started
    return failed[0], time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("list", "check", "run"), help="check: every edit's text is found")
    parser.add_argument("--only", default="", help="comma-separated names (or unique parts of names)")
    parser.add_argument("--json", type=Path, help="write the outcomes here")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one mutation's tests may take")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(part in m.name for part in args.only.split(","))]
    if not chosen:
        print(f"error: --only {args.only!r} names no mutation (`list` shows them)", file=sys.stderr)
        return 2
    if args.command == "list":
        for m in chosen:
            print(f"{m.name:60} {' '.join(m.tests)}")
        return 0
    outcomes, missed = [], 0
    for m in chosen:
        if problems := stale(m):
            print(f"STALE   {m.name}: {'; '.join(problems)}", flush=True)
            outcomes.append({"mutation": m.name, "caught_by": "", "stale": problems})
            missed += 1
            continue
        if args.command == "check":
            continue
        originals = apply(m)
        try:
            test, seconds = caught_by(m, args.timeout)
        finally:
            restore(originals)
        missed += not test
        print(f"{'CAUGHT' if test else 'MISSED'}  {m.name}: {test or ' '.join(m.tests)} ({seconds:.0f} s)", flush=True)
        outcomes.append({"mutation": m.name, "caught_by": test, "seconds": round(seconds, 1)})
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1) + "\n")
    print(f"{len(chosen) - missed} of {len(chosen)} mutations {'found' if args.command == 'check' else 'caught'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
