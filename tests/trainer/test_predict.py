"""predict: its COCO results score exactly eval's AP; drawings put colour where the masks are; checkpoints
carry the category names; bad input is one clear line naming the file, exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pycocotools.coco import COCO

from maskrcnn_dist.categories import Categories
from maskrcnn_dist.checkpoint import latest_checkpoint, load_checkpoint
from maskrcnn_dist.config import GALLERY_MAX, PredictConfig, saved_model_flags
from maskrcnn_dist.data import write_train_val
from maskrcnn_dist.errors import ConfigError, UserError
from maskrcnn_dist.evaluation import coco_ap
from maskrcnn_dist.outputs.draw import MASK_ALPHA, PALETTE, draw_detections
from maskrcnn_dist.outputs.gallery import (
    HEADING_INCHES,
    TITLE_INCHES,
    check_gallery_request,
    draw_gallery,
    figure_inches,
    gallery_figure,
)
from maskrcnn_dist.outputs.predict import (
    IMAGES_FILE,
    RESULTS_FILE,
    collect_images,
    draw_prediction,
    load_predictor,
    open_split,
    predict_images,
)
from maskrcnn_dist.train import train

from .conftest import fast_config

# Enough steps from scratch for a non-zero AP on tiny_coco (24 steps: bbox AP50 about 0.1), so that a
# results file that lost detections scores differently.
STEPS = 24


@pytest.fixture(scope="module")
def sparse_coco(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_coco with sparse category ids, as COCO's own (1..90 with gaps): a results file or a drawing
    that used label indices as category ids would then name categories the dataset does not have."""
    root = tmp_path_factory.mktemp("sparse_coco") / "data"
    shutil.copytree(tiny_coco, root)
    split_files = sorted(root.glob("*/annotations.json"))
    assert len(split_files) == 2  # train and val
    for split_file in split_files:
        coco = json.loads(split_file.read_text())
        sparse = {c["id"]: 10 * c["id"] + 7 for c in coco["categories"]}
        for category in coco["categories"]:
            category["id"] = sparse[category["id"]]
        for annotation in coco["annotations"]:
            annotation["category_id"] = sparse[annotation["category_id"]]
        split_file.write_text(json.dumps(coco))
    return root


@pytest.fixture(scope="module")
def trained(sparse_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the small model after STEPS steps on sparse_coco."""
    out = tmp_path_factory.mktemp("predict_run")
    cfg = fast_config(sparse_coco, out, **{"max-steps": STEPS, "epochs": 100, "lr-steps": "1000", "val-period": 0})
    train(cfg)
    checkpoint = latest_checkpoint(out / "checkpoints")
    assert checkpoint is not None
    return checkpoint


# ---------------------------------------------------------------------------------------------------
# results and AP


def test_results_file_scores_exactly_evals_ap(trained: Path, sparse_coco: Path, tmp_path: Path):
    cfg = fast_config(sparse_coco, tmp_path / "eval", resume=trained, **{"test-only": True})
    eval_ap = train(cfg).eval
    assert eval_ap["bbox_AP50"] > 0 and eval_ap["segm_AP50"] > 0  # else equality would prove nothing

    options = PredictConfig(out=tmp_path / "pred", batch_size=cfg.data.val_batch_size)
    summary = predict_images([], options, {"resume": trained, "data-path": sparse_coco, "device": "cpu"})
    assert summary.images == 4 and summary.detections > summary.drawn  # the file keeps low scores too

    gt = COCO(str(sparse_coco / "val" / "annotations.json"))
    loaded = gt.loadRes(str(tmp_path / "pred" / RESULTS_FILE))  # pycocotools accepts the file as written
    records = json.loads((tmp_path / "pred" / RESULTS_FILE).read_text())
    assert len(loaded.getAnnIds()) == len(records) == summary.detections
    first = records[0]
    assert isinstance(first["segmentation"]["counts"], str) and len(first["bbox"]) == 4
    assert {r["category_id"] for r in records} <= set(gt.getCatIds())
    predicted_ap = coco_ap(gt, records, gt.getImgIds())
    for key, value in predicted_ap.items():
        assert value == pytest.approx(eval_ap[key], abs=1e-9), key


def test_categories_round_trip_through_the_checkpoint(trained: Path, sparse_coco: Path, tmp_path: Path):
    train_set = open_split(sparse_coco, "train")
    stored = load_checkpoint(trained)["categories"]
    assert stored == [
        [-1, "__background__"],
        *([i, n] for i, n in zip(train_set.label_to_category_id[1:], train_set.category_names[1:])),
    ]
    predictor = load_predictor({"resume": trained, "device": "cpu"})
    assert predictor.categories == Categories.of_dataset(train_set)
    assert predictor.categories.caption(1) == train_set.category_names[1]

    # A checkpoint written before checkpoints carried categories still loads, labelled by index.
    old = torch.load(trained, weights_only=True)
    del old["categories"]
    torch.save(old, tmp_path / "old.pt")
    old_predictor = load_predictor({"resume": tmp_path / "old.pt", "device": "cpu"})
    assert old_predictor.categories.names[1:] == ("class 1", "class 2", "class 3")
    # So does a plain state dict given as --weights (its model settings are flags).
    torch.save(old["model"], tmp_path / "weights.pt")
    model_flags = {"model": "maskrcnn_resnet18_fpn", "min-size": 96, "max-size": 96, "backbone-norm": "batch"}
    by_weights = load_predictor({"weights": tmp_path / "weights.pt", "device": "cpu", **model_flags})
    assert by_weights.categories.num_classes == 4
    image = [open_split(sparse_coco, "val")[0][0]]
    torch.testing.assert_close(by_weights.predict(image), old_predictor.predict(image))


def test_a_checkpoint_rebuilds_its_model_without_the_files_it_started_from():
    saved = {"model": {"name": "maskrcnn_resnet18_fpn", "min_size": 96, "weights_backbone": "/gone/r18.pth"}}
    flags = saved_model_flags(saved)
    assert flags["model"] == "maskrcnn_resnet18_fpn" and flags["min-size"] == 96
    assert "weights-backbone" not in flags and flags["backbone-norm"] == "frozen"  # what "auto" meant then
    assert saved_model_flags({"model": {"backbone_norm": "auto"}})["backbone-norm"] == "batch"


def test_gallery_draws_predictions_beside_truth(trained: Path, tmp_path: Path):
    png = draw_gallery(trained, 2, tmp_path / "report_gallery.png")  # the dataset the checkpoint names
    from PIL import Image

    with Image.open(png) as im:
        assert im.width > im.height / 2 > 100  # two columns, two rows


# ---------------------------------------------------------------------------------------------------
# inputs and outputs: no drawing replaces another, an input image, or an earlier run's results


def _png(path: Path, size: tuple[int, int] = (40, 30)) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 120, 150)).save(path)
    return path


@pytest.mark.parametrize(
    "files",
    [
        ["a/x.png", "b/x.png"],  # the same name in two folders
        ["a/x.png", "b/x.png", "x-2.png"],  # ... and a file named like the second one's drawing
        ["x.png", "x.jpg"],  # one stem, two formats
        ["a/X.png", "b/x.png"],  # one name on a case-insensitive file system
        ["a/x.png", "b/x.png", "c/x-2.png", "x-2-2.png"],
    ],
)
def test_every_image_gets_its_own_drawing(tmp_path: Path, files: list[str]):
    for name in files:
        _png(tmp_path / "in" / name)
    images = collect_images([tmp_path / "in"])
    assert len(images) == len(files)
    assert len({item.name.casefold() for item in images}) == len(files), [item.name for item in images]


def test_a_folder_is_searched_outside_the_output_folder(tmp_path: Path):
    _png(tmp_path / "in" / "a.png")
    _png(tmp_path / "in" / "pred" / "a.png")  # an earlier run's drawing, under --out
    _png(tmp_path / "in" / "sub" / "b.PNG")
    (tmp_path / "in" / "notes.txt").write_text("not an image")
    found = collect_images([tmp_path / "in"], out=tmp_path / "in" / "pred")
    assert [item.path.relative_to(tmp_path / "in").as_posix() for item in found] == ["a.png", "sub/b.PNG"]
    assert [item.image_id for item in found] == [1, 2]


def test_earlier_predictions_are_refused_or_moved_aside(trained: Path, tmp_path: Path):
    photos = [_png(tmp_path / "in" / "a" / "x.png"), _png(tmp_path / "in" / "b" / "x.png")]
    out = tmp_path / "in" / "pred"  # inside the input folder: a second run must not predict its drawings
    flags = {"resume": trained, "device": "cpu"}
    first = predict_images([tmp_path / "in"], PredictConfig(out=out), flags)
    drawings = sorted(p.name for p in out.glob("*.png"))
    assert first.images == 2 and len(drawings) == 2
    before = {name: (out / name).read_bytes() for name in (RESULTS_FILE, IMAGES_FILE, *drawings)}
    with pytest.raises(UserError, match=r"already holds predictions .*detections.json, images.json, 2 drawing"):
        predict_images([photos[0]], PredictConfig(out=out), flags)
    assert {name: (out / name).read_bytes() for name in before} == before  # nothing written over

    second = predict_images([tmp_path / "in"], PredictConfig(out=out, overwrite=True), flags)
    assert second.images == 2  # not the first run's drawings, which are under --out
    (replaced,) = out.glob("replaced-*")
    assert {name: (replaced / name).read_bytes() for name in before} == before  # moved, not deleted

    with pytest.raises(UserError, match=r"the drawing of .*x.png would replace that image itself"):
        predict_images([photos[0]], PredictConfig(out=photos[0].parent, overwrite=True), flags)
    assert photos[0].read_bytes() == (tmp_path / "in" / "b" / "x.png").read_bytes()  # both still the photo


@pytest.mark.parametrize(
    ("rows", "height", "width"),
    [(1, 96, 128), (GALLERY_MAX, 256, 256), (GALLERY_MAX, 480, 640), (GALLERY_MAX, 4096, 3072), (3, 30000, 200)],
)
def test_a_gallery_is_a_png_a_viewer_opens(rows: int, height: int, width: int):
    from PIL import Image

    inches_wide, inches_high = figure_inches(rows, height, width)
    assert inches_high * 100 < 2**16 and inches_wide * inches_high * 100**2 < Image.MAX_IMAGE_PIXELS
    if height <= 480:  # small and COCO-sized images keep their own pixels
        assert inches_high == pytest.approx(rows * (height / 100 + TITLE_INCHES) + HEADING_INCHES)


@pytest.mark.parametrize(
    ("resume", "count", "message"),
    [
        (None, 4, "needs --resume CHECKPOINT"),
        (Path("run/checkpoints"), 0, f"must be 1 to {GALLERY_MAX} images, got 0"),
        (Path("run/checkpoints"), GALLERY_MAX + 1, f"got {GALLERY_MAX + 1}"),
    ],
)
def test_a_gallery_request_is_checked_first(resume: Path | None, count: int, message: str):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_gallery_request(resume, count)
    check_gallery_request(Path("run/checkpoints"), GALLERY_MAX)


@pytest.mark.parametrize("rows", [1, 2, 6, 20])
def test_the_gallery_heading_clears_the_first_row(rows: int):
    image = torch.full((3, 256, 256), 120, dtype=torch.uint8)
    fig = gallery_figure([(i, image, image) for i in range(rows)], "checkpoint run/checkpoints: a heading", 0.5)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    heading = fig._suptitle.get_window_extent(renderer)
    first_titles = [ax.title.get_window_extent(renderer) for ax in fig.axes[:2]]
    assert all(heading.y0 >= title.y1 for title in first_titles)  # display y grows upwards
    from maskrcnn_dist.outputs.report import pyplot

    pyplot().close(fig)


def test_report_refuses_a_gallery_without_a_model_before_writing(tmp_path: Path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"kind": "train", "step": 1, "loss": 1.0}) + "\n")
    argv = [sys.executable, "-m", "maskrcnn_dist.cli", "report", "--metrics", metrics, "--gallery", "2"]
    result = subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=120)
    assert "needs --resume" in _the_error_line(result)
    assert not (tmp_path / "report.png").exists()


# ---------------------------------------------------------------------------------------------------
# drawing


def _grey(height: int = 80, width: int = 96) -> torch.Tensor:
    return torch.full((3, height, width), 100, dtype=torch.uint8)


def test_drawing_colours_the_mask_and_leaves_the_rest():
    image = _grey()
    mask = torch.zeros(1, 80, 96, dtype=torch.bool)
    mask[0, 40:60, 30:50] = True
    box = torch.tensor([[20.0, 30.0, 60.0, 70.0]])  # 10 px around the mask
    drawn = draw_detections(image, box, mask, ["a"], "none")  # the caption sits inside the box, top left
    colour = torch.tensor(PALETTE[0], dtype=torch.float32)[:, None, None]
    expected = (image.float() * (1 - MASK_ALPHA) + colour * MASK_ALPHA).to(torch.uint8)
    inside = mask[0]
    assert (
        drawn[:, inside].int() - expected[:, inside].int()
    ).abs().max() <= 1  # every mask pixel, blended with its colour
    between = torch.zeros(80, 96, dtype=torch.bool)
    between[46:68, 23:58] = True  # inside the box, clear of its 1 px outline and the caption
    between &= ~inside
    assert torch.equal(drawn[:, between], image[:, between])  # no colour beside the mask
    far = torch.ones(80, 96, dtype=torch.bool)
    far[15:75, 15:65] = False  # the box, its caption above it, and a margin
    assert torch.equal(drawn[:, far], image[:, far])


def test_each_instance_has_its_own_colour():
    masks = torch.zeros(2, 80, 96, dtype=torch.bool)
    masks[0, 10:30, 10:30] = True
    masks[1, 40:70, 50:90] = True
    boxes = torch.tensor([[5.0, 5.0, 35.0, 35.0], [45.0, 35.0, 95.0, 75.0]])
    drawn = draw_detections(_grey(), boxes, masks, ["a", "b"], "none")
    first, second = drawn[:, 25, 25], drawn[:, 65, 80]
    assert not torch.equal(first, second) and not torch.equal(first, _grey()[:, 0, 0])


def test_low_scores_are_not_drawn_and_an_empty_image_gets_a_note():
    image = torch.full((3, 80, 96), 0.4)
    masks = torch.zeros(1, 1, 80, 96)
    masks[0, 0, 40:60, 30:50] = 0.9
    detection = {
        "boxes": torch.tensor([[30.0, 40.0, 50.0, 60.0]]),
        "labels": torch.tensor([1]),
        "scores": torch.tensor([0.3]),
        "masks": masks,
    }
    categories = Categories.by_index(2)
    drawn = draw_prediction(image, detection, categories, threshold=0.5)
    plain = draw_prediction(image, {**detection, "scores": torch.tensor([0.0])}, categories, threshold=0.5)
    assert torch.equal(drawn, plain)
    scale = drawn.shape[-1] // 96  # small images are enlarged for legible captions
    changed = (drawn != torch.full_like(drawn, 102)).any(0)  # 0.4 * 255 rounds to 102
    rows, cols = changed.nonzero().max(0).values.tolist()
    assert changed.any() and rows < 20 and cols < drawn.shape[-1] // 2  # only the note, top left
    shown = draw_prediction(image, detection, categories, threshold=0.2)
    assert (shown[:, 45 * scale, 40 * scale] != 102).all()  # drawn once the threshold admits it


# ---------------------------------------------------------------------------------------------------
# bad input, through the CLI in a subprocess

LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) ")


def _predict_cli(*args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    argv = [sys.executable, "-m", "maskrcnn_dist.cli", "predict", "--device", "cpu", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)


def _the_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line of stderr that is not an INFO log record; exit status 2."""
    lines = [line for line in result.stderr.splitlines() if not LOG_RECORD.match(line)]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad_inputs")
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (root / "notes.txt").write_text("a text file, not an image\n")
    (root / "garbage.pt").write_bytes(b"not a zip")
    torch.save({"something": 1}, root / "foreign.pt")
    (root / "taken").write_text("a file where the output folder should go\n")
    (root / "empty.png").write_bytes(b"")
    good = _png(root / "good.png")
    (root / "truncated.png").write_bytes(good.read_bytes()[:-20])
    (root / "no_images").mkdir()
    (root / "no_images" / "notes.txt").write_text("no images here\n")
    (root / "weights.txt").write_text("not a weights file\n")
    _png(root / "earlier" / "other.png")
    (root / "earlier" / RESULTS_FILE).write_text("[]")
    write_train_val(root / "two_classes", num_train=2, num_val=2, seed=1, image_size=(48, 64), num_classes=2)
    return root


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("broken image", r"broken.png: cannot read image"),
        ("text file as image", r"notes.txt: cannot read image"),
        ("unreadable checkpoint", r"checkpoint .*garbage.pt is not a PyTorch file"),
        ("foreign checkpoint", r"checkpoint .*foreign.pt is not a maskrcnn-dist checkpoint"),
        ("class count", r"two_classes/val/annotations.json: 2 categories, but checkpoint .* was trained for 3"),
        ("out is a file", r"--out .*taken: an existing file, not a folder"),
        ("zero-byte image", r"empty.png: cannot read image"),
        ("truncated image", r"truncated.png: image file is truncated"),
        ("folder without images", r"no_images: no image files"),
        ("missing image", r"missing.png: no such file or folder"),
        ("text file as weights", r"weights file .*weights.txt is not a PyTorch file"),
        ("drawing over its input", r"--out .*: the drawing of .*good.png would replace that image itself"),
        ("earlier predictions", r"--out .*earlier already holds predictions \(detections.json\): add --overwrite"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(trained: Path, bad_inputs: Path, case: str, message: str):
    out = bad_inputs / f"out-{case.replace(' ', '-')}"
    args = {
        "broken image": ["--resume", trained, "--out", out, bad_inputs / "broken.png"],
        "text file as image": ["--resume", trained, "--out", out, bad_inputs / "notes.txt"],
        "unreadable checkpoint": ["--resume", bad_inputs / "garbage.pt", "--out", out, bad_inputs / "good.png"],
        "foreign checkpoint": ["--resume", bad_inputs / "foreign.pt", "--out", out, bad_inputs / "good.png"],
        "class count": ["--resume", trained, "--out", out, "--data-path", bad_inputs / "two_classes"],
        "out is a file": ["--resume", trained, "--out", bad_inputs / "taken", bad_inputs / "broken.png"],
        # A bad image after a good one: refused before anything is predicted or written.
        "zero-byte image": ["--resume", trained, "--out", out, bad_inputs / "good.png", bad_inputs / "empty.png"],
        "truncated image": ["--resume", trained, "--out", out, bad_inputs / "good.png", bad_inputs / "truncated.png"],
        "folder without images": ["--resume", trained, "--out", out, bad_inputs / "no_images"],
        "missing image": ["--resume", trained, "--out", out, bad_inputs / "missing.png"],
        "text file as weights": ["--weights", bad_inputs / "weights.txt", "--out", out, bad_inputs / "good.png"],
        "drawing over its input": ["--resume", trained, "--out", bad_inputs, bad_inputs / "good.png"],
        "earlier predictions": ["--resume", trained, "--out", bad_inputs / "earlier", bad_inputs / "good.png"],
    }[case]
    line = _the_error_line(_predict_cli(*args))
    assert line.startswith("error: ") and re.search(message, line), line
    assert not out.exists()  # nothing written for a run that was refused
