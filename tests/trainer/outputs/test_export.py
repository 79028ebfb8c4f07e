"""export: TorchScript and ONNX files of a trained checkpoint pass the parity check against the eager
model, keep the categories beside them and take images of any size; a corrupted export fails the check
and is kept as OUT.failed, never as --out; bad input is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnxruntime
import pytest
import torch
import torchvision  # noqa: F401 (registers the nms and roi_align ops a TorchScript file calls)

from maskrcnn_dist.config import ExportConfig
from maskrcnn_dist.errors import ParityError
from maskrcnn_dist.outputs.export import (
    FAILED_SUFFIX,
    FORMATS,
    METADATA_FILE,
    ONNX_INPUT,
    Cut,
    ExportError,
    compare,
    export_model,
)
from maskrcnn_dist.outputs.export import formats as formats_module
from maskrcnn_dist.outputs.predictor import load_predictor

from .conftest import write_png

# torch deprecates TorchScript (jit.load, jit.save) and says so at every use; the scripted model warns
# that it returns (losses, detections).
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning"),
    pytest.mark.filterwarnings("ignore:RCNN always returns:UserWarning"),
]

SUFFIX = {"torchscript": ".pt", "onnx": ".onnx"}
# One weight of the exported file: the bias of class 1's score raises every class-1 score.
CORRUPTED = "roi_heads.box_predictor.cls_score.bias"


def export(trained: Path, out: Path, fmt: str, **options: object):
    return export_model(ExportConfig(format=fmt, out=out, **options), {"resume": trained}, [], echo=lambda line: None)


def categories_of(path: Path, fmt: str) -> list[dict]:
    if fmt == "torchscript":
        extra = {METADATA_FILE: ""}
        torch.jit.load(str(path), _extra_files=extra)
        return json.loads(extra[METADATA_FILE])["categories"]
    return json.loads(path.with_suffix(".json").read_text())["categories"]


def run_exported(path: Path, fmt: str, image: torch.Tensor) -> int:
    """How many detections the exported file returns for `image`."""
    if fmt == "torchscript":
        _, detections = torch.jit.load(str(path))([image])
        return len(detections[0]["boxes"])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    boxes, labels, scores, masks = session.run(None, {ONNX_INPUT: image.numpy()})
    assert masks.shape[2:] == image.shape[1:]
    return len(boxes)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_the_export_passes_its_parity_check_and_keeps_the_categories(trained: Path, tmp_path: Path, fmt: str):
    out = tmp_path / f"model{SUFFIX[fmt]}"
    summary = export(trained, out, fmt)
    assert [r.name for r in summary.parity] == ["000001", "000002", "000003", "000004"]  # the run's val split
    assert all(r.ok for r in summary.parity)
    assert sum(r.eager for r in summary.parity) > 0  # else parity would prove nothing
    assert all(r.matched == r.eager == r.exported for r in summary.parity)
    beside = [out.with_suffix(".json").name] if fmt == "onnx" else []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, *beside])  # no temporary file left
    # the checkpoint's categories, with the dataset's sparse COCO ids
    assert [(c["label"], c["id"]) for c in categories_of(out, fmt)] == [(1, 17), (2, 27), (3, 37)]
    assert run_exported(out, fmt, torch.rand(3, 50, 130)) >= 0  # a size none of the checked images has


def corrupt(fmt: str, path: Path) -> None:
    """Add 3 to one weight of the written file (class 1's score bias)."""
    if fmt == "torchscript":
        extra = {METADATA_FILE: ""}
        module = torch.jit.load(str(path), _extra_files=extra)
        with torch.no_grad():
            module.roi_heads.box_predictor.cls_score.bias[1] += 3.0
        torch.jit.save(module, str(path), _extra_files=extra)
        return
    model = onnx.load(str(path))
    (weight,) = [w for w in model.graph.initializer if w.name == CORRUPTED]
    values = onnx.numpy_helper.to_array(weight).copy()
    values[1] += 3.0
    weight.CopyFrom(onnx.numpy_helper.from_array(values, CORRUPTED))
    onnx.save(model, str(path))


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_corrupted_export_fails_and_never_replaces_a_good_file(
    trained: Path, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
):
    out = tmp_path / f"model{SUFFIX[fmt]}"
    out.write_bytes(b"an earlier, good export")
    original = FORMATS[fmt].write

    def write_then_corrupt(model, example, path, metadata):
        original(model, example, path, metadata)
        corrupt(fmt, path)

    monkeypatch.setattr(FORMATS[fmt], "write", write_then_corrupt)
    with pytest.raises(ParityError, match=rf"worst: 00000\d: .*kept as .*model{SUFFIX[fmt]}{FAILED_SUFFIX}"):
        export(trained, out, fmt, overwrite=True)
    assert out.read_bytes() == b"an earlier, good export"
    assert (tmp_path / f"model{SUFFIX[fmt]}{FAILED_SUFFIX}").stat().st_size > 1_000_000
    assert not out.with_suffix(".json").exists() or fmt != "onnx"  # no metadata for a failed file


def detections(boxes: list[list[float]], scores: list[float], size: int = 40) -> dict[str, torch.Tensor]:
    """Detections of label 1 whose masks fill their boxes (rounded to whole pixels)."""
    masks = torch.zeros(len(boxes), 1, size, size)
    for k, (x1, y1, x2, y2) in enumerate(boxes):
        masks[k, 0, round(y1) : round(y2), round(x1) : round(x2)] = 1.0
    return {
        "boxes": torch.tensor(boxes).reshape(-1, 4),
        "labels": torch.ones(len(boxes), dtype=torch.int64),
        "scores": torch.tensor(scores),
        "masks": masks,
    }


CUT = Cut(score_thresh=0.05, per_image=100)


def test_parity_judges_pairs_and_lets_detections_differ_only_at_the_cut():
    eager = detections([[2, 2, 30, 30], [5, 5, 9, 6.4]], [0.9, 0.0505])
    same = compare("same", (40, 40), eager, detections([[2, 2, 30, 30]], [0.9]), CUT)  # lost one at the cut
    assert same.ok and (same.matched, same.mask_iou) == (1, 1.0)
    thin = compare("thin", (40, 40), eager, detections([[2, 2, 30, 30], [5, 5, 9, 6.6]], [0.9, 0.0505]), CUT)
    assert thin.ok and thin.mask_iou > 0.99  # a thin mask a pixel taller: pooled, it hardly counts
    scored = compare("scored", (40, 40), eager, detections([[2, 2, 30, 30]], [0.8]), CUT)
    assert [what for _, what, _ in scored.problems] == ["score difference"]
    lost = compare("lost", (40, 40), eager, detections([[5, 5, 9, 6.4]], [0.0505]), CUT)
    assert not lost.ok and "1 eager detection(s) without a partner, scoring up to 0.9000" in lost.worst()[0]
    moved = compare("moved", (40, 40), eager, detections([[4, 2, 32, 30], [5, 5, 9, 6.4]], [0.9, 0.0505]), CUT)
    assert {what for _, what, _ in moved.problems} == {"box difference px", "mask IoU shortfall"}


def test_onnx_without_its_packages_is_refused_before_any_work(trained: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(formats_module, "ONNX_PACKAGES", ("onnx", "no_such_onnx_runtime"))
    with pytest.raises(ExportError, match=r"--format onnx needs no_such_onnx_runtime .*maskrcnn-dist\[export\]"):
        export(trained, tmp_path / "model.onnx", "onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_format_the_exporter_refuses_is_one_line_and_leaves_nothing(trained: Path, tmp_path: Path, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("Could not guard on data-dependent expression Eq(4*u1, 0)\n  (deep inside torch)")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    with pytest.raises(ExportError) as refused:
        export(trained, tmp_path / "model.onnx", "onnx")
    assert str(refused.value).startswith("--format onnx: maskrcnn_resnet18_fpn cannot be exported with torch ")
    assert "\n" not in str(refused.value) and "Could not guard on data-dependent expression" in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # no file, no temporary file, no sidecar


def test_predict_and_export_read_a_runs_best_checkpoint(trained: Path):
    run = trained.parent.parent
    predictor = load_predictor({"resume": "best", "output-dir": run, "device": "cpu"})
    assert predictor.source == f"checkpoint {run / 'checkpoints' / 'best.pt'}"


# -- through the console script --------------------------------------------------------------------------


def _inputs(tmp: Path) -> dict[str, Path]:
    made = {"folder": tmp / "folder", "taken": tmp / "taken.onnx", "notes": tmp / "notes.txt"}
    made["folder"].mkdir()
    made["taken"].write_bytes(b"a model")
    made["notes"].write_text("not an image\n")
    torch.save({"model": {"w": torch.zeros(1)}}, tmp / "foreign.pt")
    made["foreign"] = tmp / "foreign.pt"
    return made


EXPORT_CASES = [
    ("out-a-folder", ["--resume", "{ckpt}", "--format", "onnx", "--out", "{folder}"], ["--out", "a folder"]),
    ("out-exists", ["--resume", "{ckpt}", "--format", "onnx", "--out", "{taken}"], ["taken.onnx", "--overwrite"]),
    ("out-wrong-kind", ["--resume", "{ckpt}", "--format", "torchscript", "--out", "{tmp}/m.onnx"], ["end in .pt"]),
    # --out in a folder that does not exist yet: made only once the checkpoint and images are found good
    ("not-our-checkpoint", ["--resume", "{foreign}", "--format", "onnx", "--out", "{tmp}/new/m.onnx"], ["foreign.pt"]),
    ("format-unknown", ["--resume", "{ckpt}", "--format", "tflite", "--out", "{tmp}/m.onnx"], ["--format", "tflite"]),
    ("no-format", ["--resume", "{ckpt}", "--out", "{tmp}/m.onnx"], ["--format torchscript|onnx is required"]),
    ("no-model", ["--format", "onnx", "--out", "{tmp}/m.onnx"], ["export needs one of --resume", "--weights"]),
    (
        "images-not-images",
        ["--resume", "{ckpt}", "--format", "onnx", "--out", "{tmp}/m.onnx", "--images", "{notes}"],
        ["--images", "notes.txt"],
    ),
    (
        "no-best-yet",
        ["--resume", "best", "--output-dir", "{folder}", "--format", "onnx", "--out", "{tmp}/m.onnx"],
        ["--resume best", "best.pt does not exist"],
    ),
    ("parity-images-zero", ["--parity-images", "0"], ["--parity-images must be >= 1"]),
]


@pytest.mark.parametrize(("case", "args", "fragments"), EXPORT_CASES, ids=[c[0] for c in EXPORT_CASES])
def test_bad_export_input_is_one_line(console, trained: Path, tmp_path: Path, case, args, fragments):
    values = {"tmp": str(tmp_path), "ckpt": str(trained), **{k: str(v) for k, v in _inputs(tmp_path).items()}}
    before = sorted(p.name for p in tmp_path.iterdir())
    result = console("maskrcnn-dist", "export", *[a.format(**values) for a in args])
    result.assert_one_error_line(2, *[f.format(**values) for f in fragments])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing removed


def test_export_weights_with_images_through_the_console(console, trained: Path, tmp_path: Path):
    image = write_png(tmp_path / "photos" / "a.png", (90, 60))
    write_png(tmp_path / "photos" / "b.png", (70, 80))
    model = ["--model", "maskrcnn_resnet18_fpn", "--min-size", "96", "--max-size", "96"]
    out = tmp_path / "exports" / "model.pt"  # a folder made for it
    args = ["--weights", str(trained), *model, "--format", "torchscript", "--out", str(out)]
    result = console("maskrcnn-dist", "export", *args, "--images", str(image.parent))
    assert result.code == 0, result.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert rows["a"][1] == "90x60" and rows["b"][1] == "70x80" and rows["a"][-1] == rows["b"][-1] == "ok"
    assert f"wrote {out} (torchscript" in result.stdout and METADATA_FILE in result.stdout
    assert out.is_file()
