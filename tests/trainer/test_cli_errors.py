"""Every user mistake on `maskrcnn-dist` is one `error:` line on stderr naming the file, flag or field,
with exit 2, and loses nothing; run through the real console script in a subprocess, as a user would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from maskrcnn_dist.config import small_cpu_run, to_argv
from maskrcnn_dist.run_dir import REPLACED_PREFIX, checkpoint_name, resume_problem
from maskrcnn_dist.training.samples import read_samples

# The data check before training would find a bad image first; the loader-worker path is tested without it.
CHECK_OFF = ["--check-data", "off"]
# The small run every case starts from; a flag under test replaces its own (an option given twice is refused).
TINY_FLAGS = small_cpu_run(64, max_steps=1, epochs=1, workers=0, warmup_iters=1, print_freq=1)
TINY = to_argv(TINY_FLAGS)


def tiny(*extra: str) -> list[str]:
    """TINY without the flags `extra` names, then `extra`."""
    named = {word[2:].split("=", 1)[0] for word in extra if word.startswith("--")}
    named |= {name.removeprefix("no-") for name in named}
    return [*to_argv({flag: value for flag, value in TINY_FLAGS.items() if flag not in named}), *extra]


def _files(tmp: Path) -> dict[str, Path]:
    """User inputs of the kinds the cases need."""
    made = {
        "file": tmp / "a-file",
        "binary": tmp / "binary.yaml",
        "list-yaml": tmp / "list.yaml",
        "range-yaml": tmp / "range.yaml",
        "path-list-yaml": tmp / "path-list.yaml",
        "twice-yaml": tmp / "twice.yaml",
        "spellings-yaml": tmp / "spellings.yaml",
        "micro-yaml": tmp / "micro.yaml",
        "text-weights": tmp / "weights.pt",
        "no-loss": tmp / "no-loss.jsonl",
        "json-list": tmp / "list.jsonl",
        "binary-metrics": tmp / "binary.jsonl",
        "metrics": tmp / "metrics.jsonl",
        "kind-list": tmp / "kind-list.jsonl",
        "ap-text": tmp / "ap-text.jsonl",
        "best-text": tmp / "best-text.jsonl",
    }
    made["file"].write_text("not a folder\n")
    made["binary"].write_bytes(bytes(range(256)))
    made["list-yaml"].write_text("- a list\n")
    made["range-yaml"].write_text("threads: -1\n")
    made["path-list-yaml"].write_text("data-path: [coco, more]\n")
    made["twice-yaml"].write_text("lr: 0.1\nepochs: 2\nlr: 0.2\n")
    made["spellings-yaml"].write_text("data_path: coco\ndata-path: other\n")
    made["micro-yaml"].write_text("engine: local\nmicro_batches: 2\n")
    made["text-weights"].write_text("hello\n")
    made["no-loss"].write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    made["json-list"].write_text("[1, 2]\n")
    made["binary-metrics"].write_bytes(b"\xff\xfe\x00garbage\n")
    train_record = json.dumps({"kind": "train", "step": 1, "loss": 1.0}) + "\n"
    made["metrics"].write_text(train_record)
    made["kind-list"].write_text(json.dumps({"kind": ["train"], "step": 1, "loss": 1.0}) + "\n")
    made["ap-text"].write_text(train_record + json.dumps({"kind": "eval", "step": 1, "bbox_AP": "high"}) + "\n")
    made["best-text"].write_text(train_record + json.dumps({"kind": "best", "step": 1, "value": "high"}) + "\n")
    # Another run's output folder (the refusal comes before any checkpoint is read, so they need not load),
    # and a checkpoint from elsewhere.
    made["used-run"] = tmp / "used-run"
    (made["used-run"] / "checkpoints").mkdir(parents=True)
    (made["used-run"] / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 2, "loss": 1.0}) + "\n")
    for step in (1, 2):
        (made["used-run"] / "checkpoints" / checkpoint_name(step)).write_bytes(b"PK\x03\x04 step %d" % step)
    made["foreign"] = tmp / "elsewhere" / checkpoint_name(2)
    made["foreign"].parent.mkdir()
    made["foreign"].write_bytes(b"PK\x03\x04 another run")
    made["far-polygon-set"] = _coco_set(tmp / "far-polygon-set", [[0, 0, 1e12, 0, 1e12, 1e12]])
    made["empty-set"] = _coco_set(tmp / "empty-set", None)
    made["checkpoints-a-file"] = tmp / "checkpoints-a-file"
    made["checkpoints-a-file"].mkdir()
    (made["checkpoints-a-file"] / "checkpoints").write_text("a note, not the folder of checkpoints\n")
    made["good-set"] = _coco_set(tmp / "good-set", [[0, 0, 4, 0, 4, 4, 0, 4]])
    made["portrait-set"] = _coco_set(tmp / "portrait-set", [[0, 0, 4, 0, 4, 4, 0, 4]], (6, 8), orientation=6)
    made["thin-set"] = _coco_set(tmp / "thin-set", [[0, 0, 4, 0, 4, 1, 0, 1]], (256, 1))
    made["binary-metrics-run"] = tmp / "binary-metrics-run"
    made["binary-metrics-run"].mkdir()
    (made["binary-metrics-run"] / "metrics.jsonl").write_bytes(b"\xff\xfe\x00 not UTF-8\n")
    return made


def _coco_set(
    root: Path, polygon: list[list[float]] | None, size: tuple[int, int] = (8, 6), orientation: int = 1
) -> Path:
    """A data path whose train split has one image of `size` (stored, and annotated so) with one annotation
    of `polygon`, or no image at all; the PNG carries an EXIF `orientation` other than 1 in an eXIf chunk."""
    images = root / "train" / "images"
    images.mkdir(parents=True)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    Image.new("RGB", size).save(images / "1.png", exif=exif)
    image = {"id": 1, "file_name": "1.png", "width": size[0], "height": size[1]}
    annotation = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4], "segmentation": polygon}
    data = {
        "images": [image] if polygon else [],
        "annotations": [annotation] if polygon else [],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (root / "train" / "annotations.json").write_text(json.dumps(data))
    return root


def _snapshot(tmp: Path) -> dict[str, bytes]:
    """Every file under tmp with its bytes: a refused command must leave the user's files as they were."""
    return {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}


def _assert_nothing_lost(tmp: Path, before: dict[str, bytes]) -> None:
    """Every file that was there is still there, byte for byte (a refused run may have opened its logs)."""
    after = _snapshot(tmp)
    assert {name: after.get(name) for name in before} == before


# (case id, argv with {name} placeholders for _files and {tmp}, fragments the one error line must hold)
TRAIN_CASES = [
    ("config-is-a-folder", ["--config", "{tmp}"], ["--config", "{tmp}"]),
    ("config-binary", ["--config", "{binary}"], ["--config", "binary.yaml", "not a text"]),
    ("config-missing", ["--config", "{tmp}/none.yaml"], ["--config", "does not exist"]),
    ("config-not-a-mapping", ["--config", "{list-yaml}"], ["list.yaml", "mapping"]),
    ("config-value-out-of-range", ["--config", "{range-yaml}"], ["range.yaml", "--threads must be >= 1"]),
    ("config-path-is-a-list", ["--config", "{path-list-yaml}"], ["path-list.yaml", "data-path", "is not a path"]),
    ("config-key-twice", ["--config", "{twice-yaml}"], ["twice.yaml", "found the key 'lr' twice", "line 3"]),
    ("config-key-two-spellings", ["--config", "{spellings-yaml}"], ["spellings.yaml", "data-path is given twice"]),
    ("output-dir-empty", ["--output-dir", ""], ["--output-dir", "'' is not a path"]),
    (
        "output-dir-with-a-file-named-checkpoints",
        ["--output-dir", "{checkpoints-a-file}", "--data-path", "{good-set}"],
        ["--output-dir", "checkpoints is a file"],
    ),
    ("output-dir-is-a-file", ["--output-dir", "{file}"], ["--output-dir", "a-file", "not a folder"]),
    ("output-dir-under-a-file", ["--output-dir", "{file}/run"], ["--output-dir", "a-file is a file"]),
    ("threads-negative", ["--threads", "-1"], ["--threads must be >= 1"]),
    ("threads-zero", ["--threads", "0"], ["--threads must be >= 1"]),
    ("synthetic-image-size-zero", ["--synthetic-image-size", "0"], ["--synthetic-image-size must be >= 32"]),
    ("backbone-layers", ["--trainable-backbone-layers", "9"], ["--trainable-backbone-layers must be <= 5"]),
    ("seed-beyond-64-bits", ["--seed", str(2**70)], ["--seed must fit in a signed 64-bit integer"]),
    ("seed-negative", ["--seed", "-1"], ["--seed must be >= 0"]),
    ("clip-negative", ["--clip-grad-norm", "-1"], ["--clip-grad-norm must be > 0"]),
    ("momentum-nan", ["--momentum", "nan"], ["--momentum must be a finite number"]),
    ("momentum-one", ["--momentum", "1"], ["--momentum must be < 1"]),
    ("lr-zero", ["--lr", "0"], ["--lr must be > 0"]),
    ("lr-inf", ["--lr", "inf"], ["--lr must be a finite number"]),
    ("lr-not-a-number", ["--lr", "fast"], ["--lr", "not a number"]),
    ("weight-decay-negative", ["--weight-decay", "-1"], ["--weight-decay must be >= 0"]),
    ("gamma-above-one", ["--lr-gamma", "2"], ["--lr-gamma must be <= 1"]),
    ("norm-weight-decay-negative", ["--norm-weight-decay", "-1"], ["--norm-weight-decay must be >= 0"]),
    ("lr-scheduler-unknown", ["--lr-scheduler", "steplr"], ["--lr-scheduler", "multisteplr, cosineannealinglr"]),
    ("augmentation-unknown", ["--data-augmentation", "ssd"], ["--data-augmentation", "hflip, multiscale, lsj"]),
    (
        "copypaste-without-lsj",
        ["--use-copypaste", "--data-augmentation", "multiscale"],
        ["--use-copypaste needs --data-augmentation lsj"],
    ),
    ("recipe-unknown", ["--recipe", "detectron2"], ["--recipe", "torchvision-v1, torchvision-v2"]),
    ("sync-bn-on-the-pipeline", ["--engine", "pipeline", "--sync-bn"], ["--sync-bn is for --engine ddp"]),
    (
        "sync-bn-with-frozen-batchnorm",
        ["--engine", "ddp", "--sync-bn", "--backbone-norm", "frozen"],
        ["--sync-bn with frozen BatchNorm", "--backbone-norm batch"],
    ),
    (
        "norm-weight-decay-on-the-pipeline",
        ["--engine", "pipeline", "--norm-weight-decay", "0"],
        ["--norm-weight-decay is not available with --engine pipeline"],
    ),
    ("lr-steps-negative", ["--lr-steps", "-3,5"], ["--lr-steps must be >= 0"]),
    ("checkpoint-period-negative", ["--checkpoint-period", "-1"], ["--checkpoint-period must be >= 0"]),
    ("print-freq-zero", ["--print-freq", "0"], ["--print-freq must be >= 1"]),
    ("batch-size-zero", ["--batch-size", "0"], ["--batch-size must be >= 1"]),
    ("rpc-timeout-zero", ["--rpc-timeout", "0"], ["--rpc-timeout must be >= 1"]),
    ("rpc-timeout-below-a-second", ["--rpc-timeout", "0.001"], ["--rpc-timeout must be >= 1, got 0.001"]),
    ("epochs-zero", ["--epochs", "0"], ["--epochs must be >= 1"]),
    ("patience-zero", ["--patience", "0"], ["--patience must be >= 1"]),
    ("best-metric-unknown", ["--best-metric", "loss"], ["--best-metric 'loss'", "bbox_AP, bbox_AP50"]),
    (
        "patience-without-evaluations",
        ["--patience", "2", "--no-eval-every-epoch"],
        ["--patience", "--eval-every-epoch"],
    ),
    (
        "patience-without-a-val-split",
        ["--patience", "2", "--data-path", "{good-set}"],
        ["--patience counts evaluations", "good-set has no val split"],
    ),
    ("resume-best-in-train", ["--resume", "best"], ["--resume best is for eval", "--weights RUN/checkpoints/best.pt"]),
    ("unknown-flag", ["--batch-szie", "4"], ["--batch-szie"]),
    # Any option given twice, whichever: click would keep the last one without a word.
    (
        "data-path-twice",
        ["--data-path", "a", "--data-path", "b"],
        ["--data-path is given more than once (--data-path a, --data-path b)"],
    ),
    ("recipe-twice", ["--recipe", "torchvision-v1", "--recipe=torchvision-v2"], ["--recipe is given more than once"]),
    ("config-twice", ["--config", "{range-yaml}", "--config", "{twice-yaml}"], ["--config is given more than once"]),
    (
        "elastic-both-ways",
        ["--elastic", "--no-elastic"],
        ["--elastic/--no-elastic is given more than once (--elastic, --no-elastic)"],
    ),
    ("flag-twice-alike", ["--amp", "--amp"], ["--amp/--no-amp is given more than once"]),
    # A flag only another engine reads is refused, as --elastic and --compile are.
    (
        "micro-batches-on-ddp",
        ["--engine", "ddp", "--micro-batches", "2"],
        ["--micro-batches is for --engine pipeline", "--engine ddp never reads it"],
    ),
    (
        "join-timeout-on-local",
        ["--join-timeout", "5"],
        ["--join-timeout is for --engine pipeline", "--engine local never"],
    ),
    ("bf16-transport-on-ddp", ["--engine", "ddp", "--bf16-transport"], ["--bf16-transport is for --engine pipeline"]),
    ("pipeline-flag-from-a-config", ["--config", "{micro-yaml}"], ["--micro-batches is for --engine pipeline"]),
    ("engine-unknown", ["--engine", "mpi"], ["--engine", "'mpi' is not one of local, ddp, pipeline"]),
    ("fp16-on-cpu", ["--amp", "--amp-dtype", "float16", "--device", "cpu"], ["--amp-dtype float16 on the CPU"]),
    (
        "micro-batches-above-batch",
        ["--engine", "pipeline", "--micro-batches", "8", "--batch-size", "2"],
        ["--micro-batches 8 > --batch-size 2"],
    ),
    ("overwrite-and-resume", ["--overwrite", "--resume", "auto"], ["--overwrite and --resume"]),
    ("ddp-outside-torchrun", ["--engine", "ddp", "--synthetic-images", "4"], ["--engine ddp", "RANK"]),
    ("pipeline-outside-launcher", ["--engine", "pipeline"], ["--engine pipeline", "MASKRCNN_POD_PLAN"]),
    ("train-split-without-images", ["--data-path", "{empty-set}"], ["annotations.json", "lists no images"]),
    (
        "resume-onto-metrics-that-are-not-text",
        ["--output-dir", "{binary-metrics-run}", "--resume", "auto", "--data-path", "{good-set}", *CHECK_OFF],
        ["binary-metrics-run/metrics.jsonl is not a text file"],
    ),
    (
        "synthetic-set-into-a-folder-of-other-files",
        ["--synthetic-images", "4", "--data-path", "{used-run}"],
        ["--synthetic-images", "used-run holds other files", "--data-path"],
    ),
    ("data-path-missing", ["--data-path", "{tmp}/no-coco"], ["--data-path", "no-coco: no such folder"]),
    ("resume-missing", ["--resume", "{tmp}/no.pt", "--synthetic-images", "4"], ["--resume", "no such file"]),
    ("weights-missing", ["--weights", "{tmp}/no.pt", "--synthetic-images", "4"], ["--weights", "no such file"]),
    (
        "weights-backbone-named-as-torchvision-does",
        ["--weights-backbone", "DEFAULT", "--synthetic-images", "4"],
        ["--weights-backbone DEFAULT: no such file", "downloads nothing", "resnet18-f37072fd.pth"],
    ),
    (
        "resume-another-runs-checkpoint-into-a-run",
        ["--output-dir", "{used-run}", "--resume", "{foreign}"],
        ["--resume", "not a checkpoint of --output-dir", "used-run"],
    ),
    (
        "resume-an-older-checkpoint-of-the-run",
        ["--output-dir", "{used-run}", "--resume", "{used-run}/checkpoints/checkpoint_00000001.pt"],
        ["newer checkpoints", "checkpoint_00000002.pt"],
    ),
    (
        "weights-text-file",
        ["--weights", "{text-weights}", "--synthetic-images", "4"],
        ["weights file", "weights.pt", "not a PyTorch file"],
    ),
]

OTHER_CASES = [
    ("eval-without-model", ["eval", *TINY, "--synthetic-images", "4"], ["--test-only", "--resume"]),
    ("group-option-twice", ["-v", "--verbose", "train"], ["-v/--verbose is given more than once (-v, --verbose)"]),
    ("check-data-twice", ["check-data", "--data-path", "a", "--data-path=b"], ["--data-path is given more than once"]),
    (
        "eval-another-runs-checkpoint-into-a-run",  # its AP would be filed among that run's records
        ["eval", *TINY, "--data-path", "{good-set}", "--output-dir", "{used-run}", "--resume", "{foreign}"],
        ["--resume", "not a checkpoint of --output-dir", "used-run", "its AP would join its metrics"],
    ),
    (
        "eval-weights-into-a-run",
        ["eval", *TINY, "--data-path", "{good-set}", "--output-dir", "{used-run}", "--weights", "{text-weights}"],
        ["--output-dir", "used-run already holds a run", "its AP would join its metrics"],
    ),
    (
        "eval-best-before-any-evaluation",
        ["eval", *TINY, "--data-path", "{good-set}", "--output-dir", "{used-run}", "--resume", "best"],
        ["--resume best", "used-run/checkpoints/best.pt does not exist"],
    ),
    (
        "predict-best-before-any-evaluation",
        ["predict", "--resume", "best", "--output-dir", "{used-run}", "--out", "{tmp}/pred", "{good-set}"],
        ["--resume best", "used-run/checkpoints/best.pt does not exist"],
    ),
    (
        "report-gallery-best-before-any-evaluation",
        ["report", "--metrics", "{used-run}/metrics.jsonl", "--gallery", "1", "--resume", "best"],
        ["--resume best", "used-run/checkpoints/best.pt does not exist"],
    ),
    ("report-missing", ["report", "--metrics", "{tmp}/none.jsonl"], ["none.jsonl does not exist"]),
    (
        "report-folder-without-metrics",
        ["report", "--metrics", "{used-run}/checkpoints"],
        ["report --metrics", "checkpoints: this folder holds no metrics.jsonl", "--output-dir"],
    ),
    ("report-best-not-a-number", ["report", "--metrics", "{best-text}"], ["best-text.jsonl line 2", "'value'"]),
    ("report-without-loss", ["report", "--metrics", "{no-loss}"], ["no-loss.jsonl line 1", "'loss'"]),
    ("report-json-list", ["report", "--metrics", "{json-list}"], ["list.jsonl line 1", "JSON list"]),
    ("report-binary", ["report", "--metrics", "{binary-metrics}"], ["binary.jsonl", "not a text file"]),
    (
        "report-out-under-a-file",
        ["report", "--metrics", "{no-loss}", "--out", "{file}/r.png"],
        ["no-loss.jsonl line 1"],  # the metrics are read (and refused) before anything is written
    ),
    ("report-kind-a-list", ["report", "--metrics", "{kind-list}"], ["kind-list.jsonl line 1", "'kind'"]),
    ("report-ap-not-a-number", ["report", "--metrics", "{ap-text}"], ["ap-text.jsonl line 2", "'bbox_AP'"]),
    ("report-out-a-folder", ["report", "--metrics", "{metrics}", "--out", "{tmp}"], ["--out", "a folder"]),
    # matplotlib would write r.xyz as it likes, or the chart over the metrics it was drawn from
    ("report-out-not-a-png", ["report", "--metrics", "{metrics}", "--out", "{tmp}/r.xyz"], ["r.xyz", "end in .png"]),
    ("report-out-onto-its-metrics", ["report", "--metrics", "{metrics}", "--out", "{metrics}"], ["end in .png"]),
    (
        "profile-write-topology-onto-metrics",
        ["profile", "--device", "cpu", "--write-topology", "{metrics}"],
        ["--write-topology", "metrics.jsonl", "end in .yaml or .yml"],
    ),
    (
        "profile-micro-batches-above-batch",
        ["profile", "--device", "cpu", "--micro-batches", "3", "--batch-size", "2"],
        ["--micro-batches 3 > --batch-size 2"],
    ),
    ("demo-steps-zero", ["demo", "--steps", "0", "--output-dir", "{tmp}/demo"], ["--steps", "0"]),
    ("report-gallery-negative", ["report", "--metrics", "{no-loss}", "--gallery", "-1"], ["--gallery"]),
    ("synth-data-onto-a-file", ["synth-data", "--output", "{file}"], ["--output", "a-file", "not a folder"]),
    (
        "synth-data-onto-a-data-set",
        ["synth-data", "--output", "{good-set}", "--train-images", "2", "--val-images", "1"],
        ["--output", "good-set already holds train/"],
    ),
    ("synth-data-classes", ["synth-data", "--output", "{tmp}/d", "--classes", "9"], ["--classes"]),
    (
        "check-data-polygon-that-crashed-pycocotools",
        ["check-data", "--data-path", "{far-polygon-set}", "--split", "train"],
        ["annotations.json", "annotation id 1", "far outside the 8x6 image"],
    ),
    (
        "check-data-train-split-without-images",  # train refuses it: the check must not pass it
        ["check-data", "--data-path", "{empty-set}"],
        ["annotations.json", "the train split lists no images"],
    ),
    (
        "check-data-unknown-mode",
        ["check-data", "--data-path", "{good-set}", "--check-data", "deep"],
        ["--check-data", "'deep' is not one of header, full, off"],
    ),
    (
        "check-data-exif-apply-on-a-stored-frame-annotation",
        ["check-data", "--data-path", "{portrait-set}", "--split", "train", "--exif-orientation", "apply"],
        ["1.png (image id 1): image is stored 6x8 with EXIF orientation 6 (shown 8x6); the annotation file says 6x8"],
    ),
    (
        "check-data-image-too-thin-for-the-model",
        ["check-data", "--data-path", "{thin-set}", "--split", "train", "--min-size", "96", "--max-size", "96"],
        ["1.png (image id 1): image is too thin for the model: 256x1 resizes to 96x0 at --min-size 96"],
    ),
    ("unknown-command", ["trian"], ["trian"]),
]


def _fill(words: list[str], tmp: Path, files: dict[str, Path]) -> list[str]:
    values = {"tmp": str(tmp), **{k: str(v) for k, v in files.items()}}
    return [w.format(**values) for w in words]


@pytest.mark.parametrize(("case", "args", "fragments"), TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_train_user_errors_are_one_line_exit_2(console, tmp_path: Path, case: str, args: list[str], fragments):
    files = _files(tmp_path)
    before = _snapshot(tmp_path)
    given = _fill(args, tmp_path, files)
    output = [] if any(word.startswith("--output-dir") for word in given) else ["--output-dir", str(tmp_path / "run")]
    result = console("maskrcnn-dist", "train", *tiny(*output, *given))
    result.assert_one_error_line(2, *_fill(fragments, tmp_path, files))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before training wrote anything
    _assert_nothing_lost(tmp_path, before)


@pytest.mark.parametrize(("case", "args", "fragments"), OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_other_commands_user_errors_are_one_line_exit_2(console, tmp_path: Path, case: str, args, fragments):
    files = _files(tmp_path)
    before = _snapshot(tmp_path)
    result = console("maskrcnn-dist", *_fill(args, tmp_path, files))
    result.assert_one_error_line(2, *_fill(fragments, tmp_path, files))
    assert not (files["used-run"] / "report.png").exists()  # a gallery that cannot be drawn: no report either
    _assert_nothing_lost(tmp_path, before)


@pytest.mark.parametrize(
    ("resume", "trains", "refused"),
    [
        ("auto", True, False),
        ("{used-run}/checkpoints", True, False),
        ("{used-run}/checkpoints/checkpoint_00000002.pt", True, False),  # the newest: continues the run
        ("{used-run}/checkpoints/checkpoint_00000001.pt", True, True),  # training would replace step 2's
        ("{used-run}/checkpoints/checkpoint_00000001.pt", False, False),  # evaluating it only adds a record
        ("{foreign}", True, True),
        ("{foreign}", False, True),
        (None, False, True),  # eval --weights into a run: not one of its checkpoints
    ],
)
def test_what_may_continue_or_evaluate_in_a_run(tmp_path: Path, resume: str | None, trains: bool, refused: bool):
    files = _files(tmp_path)
    source = None if resume is None else _fill([resume], tmp_path, files)[0]
    problem = resume_problem(files["used-run"], source, ["metrics.jsonl"], trains=trains)
    assert (problem is not None) == refused, problem


def test_device_cuda_without_one_is_refused_before_any_data_is_made(console, tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    run = tmp_path / "run"
    result = console(
        "maskrcnn-dist", "train", *tiny("--output-dir", str(run), "--device", "cuda", "--synthetic-images", "4")
    )
    result.assert_one_error_line(2, "--device cuda: no CUDA device is visible")
    assert not run.exists()  # no synthetic set, no cache: nothing to clear up after a wrong flag


def test_debug_shows_the_traceback_before_the_line(console, tmp_path: Path):
    for args, env in ((["--debug"], None), ([], {"MASKRCNN_DEBUG": "1"})):
        result = console("maskrcnn-dist", *args, "train", "--threads", "0", env=env)
        assert result.code == 2
        assert "Traceback (most recent call last)" in result.stderr
        assert result.error_lines[-1] == "error: command line: --threads must be >= 1, got 0"


def _train(console, out: Path, *extra: str, steps: int = 2):
    args = tiny("--max-steps", str(steps), "--epochs", "10", "--synthetic-images", "4", "--batch-size", "2")
    return console("maskrcnn-dist", "train", *args, "--checkpoint-period", "1", "--output-dir", str(out), *extra)


@pytest.mark.slow
def test_a_run_is_never_overwritten(console, tmp_path: Path):
    out = tmp_path / "run"
    first = _train(console, out)
    assert first.code == 0, first.stderr[-3000:]
    metrics = (out / "metrics.jsonl").read_text()
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())

    again = _train(console, out)
    again.assert_one_error_line(2, f"--output-dir {out} already holds a run", "--resume auto", "--overwrite")
    assert (out / "metrics.jsonl").read_text() == metrics
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == checkpoints

    replaced = _train(console, out, "--overwrite")
    assert replaced.code == 0, replaced.stderr[-3000:]
    (moved,) = [p for p in out.iterdir() if p.name.startswith(REPLACED_PREFIX)]
    assert (moved / "metrics.jsonl").read_text() == metrics  # moved aside, byte for byte
    assert sorted(p.name for p in (moved / "checkpoints").iterdir()) == checkpoints
    assert (out / "metrics.jsonl").read_text().count('"kind": "train"') == 2  # the new run's own records


@pytest.mark.slow
def test_a_resume_leaves_one_record_per_step(console, tmp_path: Path):
    out = tmp_path / "run"
    assert _train(console, out, steps=2).code == 0
    # The crash after checkpoint 2: records of steps 3 and 4 were written, their checkpoint was not.
    with open(out / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"kind": "note", "text": "a line of the user's, without a step"}) + "\n")
        for step in (3, 4):
            handle.write(json.dumps({"kind": "train", "step": step, "loss": 9.0, "time": 0}) + "\n")
        handle.write('{"kind": "train", "st')  # torn by the kill
    # ... and so were their sample lines, here those of a rank that the resumed run no longer has.
    (out / "samples" / "rank1.jsonl").write_text("".join(json.dumps({"step": s, "rank": 1}) + "\n" for s in (2, 3)))
    resumed = _train(console, out, "--resume", "auto", steps=4)
    assert resumed.code == 0, resumed.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]
    assert all(r["loss"] != 9.0 for r in records if r["kind"] == "train")  # steps 3-4 are the re-run's
    assert [r["kind"] for r in records].count("note") == 1  # not the resume's to delete
    samples = [(s["step"], s["rank"]) for s in read_samples(out)]
    assert samples == [(1, 0), (2, 0), (2, 1), (3, 0), (4, 0)]  # one line per rank and step: 3-4 the re-run's


@pytest.mark.slow
def test_a_bad_image_found_by_a_loader_worker_is_one_line(console, tmp_path: Path):
    data = tmp_path / "data"
    made = console("maskrcnn-dist", "synth-data", "--output", str(data), "--train-images", "4", "--val-images", "2")
    assert made.code == 0, made.stderr
    bad = sorted((data / "train" / "images").iterdir())[0]
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)  # a truncated PNG: the header passes, decoding fails
    args = tiny("--data-path", str(data), "--workers", "1", "--output-dir", str(tmp_path / "run"))
    result = console("maskrcnn-dist", "train", *args, *CHECK_OFF)
    result.assert_one_error_line(2, bad.name, "cannot read image")


@pytest.mark.parametrize("loss", [1.0, 0.0, float("nan")], ids=["positive", "zero", "nan"])
def test_a_report_that_draws_says_nothing_on_stderr(console, tmp_path: Path, loss: float):
    """A run without evaluation, or with losses a log axis cannot show, is drawn without matplotlib's
    warnings: stderr is for the one error line."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"kind": k, "step": 1, "loss": loss}) + "\n" for k in ("train", "val")))
    result = console("maskrcnn-dist", "report", "--metrics", str(metrics))
    assert (result.code, result.stderr) == (0, ""), result.stderr
    assert (tmp_path / "report.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            "DistNetworkError",
            "The client socket has timed out after 2000ms while trying to connect to (10.0.0.1, 29500).",
        ),
        ("DistStoreError", "wait timeout after 30000ms, keys: /maskrcnn-elastic//g4/pg/0//cpu//0/2"),
    ],
)
def test_a_wait_for_a_peer_that_runs_out_names_rpc_timeout(error: str, message: str) -> None:
    """torch says which socket or key it waited for, never which flag bounded the wait."""
    import torch.distributed as dist

    from maskrcnn_dist.errors import classify

    failure = classify(getattr(dist, error)(message))
    assert failure is not None and failure.code == 1 and len(failure.lines) == 1
    assert failure.lines[0].startswith(
        f"{error}: {message.rstrip('.')}; every wait for a peer is bounded by --rpc-timeout"
    )
    assert classify(dist.DistNetworkError("Connection reset by peer")) is None  # a lost peer is not a timeout
