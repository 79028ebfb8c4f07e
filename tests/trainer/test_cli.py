"""The CLI: every train flag is an option, and the commands that need no model run."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from maskrcnn_dist.cli import main
from maskrcnn_dist.config import BY_FLAG


def test_every_flag_is_on_the_cli():
    help_text = CliRunner().invoke(main, ["train", "--help"]).output
    for flag in BY_FLAG:
        assert f"--{flag}" in help_text


def test_synth_data_and_report_commands(tmp_path: Path):
    runner = CliRunner()
    made = runner.invoke(
        main,
        [
            "synth-data",
            "--output",
            str(tmp_path / "d"),
            "--train-images",
            "3",
            "--val-images",
            "2",
            "--image-size",
            "64",
        ],
    )
    assert made.exit_code == 0, made.output
    assert (tmp_path / "d/train/annotations.json").is_file() and (tmp_path / "d/val/images").is_dir()
    missing = runner.invoke(main, ["report", "--metrics", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "none.jsonl does not exist" in missing.output


def test_report_takes_a_run_folder_for_its_metrics(tmp_path: Path):
    """`report --metrics RUN_DIR`, as `--output-dir` names it: its metrics.jsonl, the PNG beside it."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    records = [{"kind": "train", "step": s, "loss": 2.0 / s} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = CliRunner().invoke(main, ["report", "--metrics", str(run)])
    assert drawn.exit_code == 0, drawn.output
    assert drawn.output.strip() == str(run / "report.png") and (run / "report.png").is_file()
