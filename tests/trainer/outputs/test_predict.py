"""predict: its COCO results score exactly eval's AP; checkpoints carry the category names; no drawing
replaces another, an input image, or an earlier run's results; bad input is one clear line naming the
file, exit 2."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from pycocotools.coco import COCO

from maskrcnn_dist.categories import Categories
from maskrcnn_dist.checkpoint import load_checkpoint
from maskrcnn_dist.config import PredictConfig, build_config
from maskrcnn_dist.data import write_train_val
from maskrcnn_dist.data.prepare import open_split
from maskrcnn_dist.errors import UserError
from maskrcnn_dist.evaluation import coco_ap
from maskrcnn_dist.outputs.inputs import collect_images
from maskrcnn_dist.outputs.predict import IMAGES_FILE, RESULTS_FILE, predict_images
from maskrcnn_dist.outputs.predictor import load_predictor
from maskrcnn_dist.train import train

from ..conftest import MODEL_HEADS, fast_config
from .conftest import the_error_line, write_png

# ---------------------------------------------------------------------------------------------------
# results and AP


def test_results_file_scores_exactly_evals_ap(trained: Path, sparse_coco: Path, tmp_path: Path):
    # The trained run's heads (outputs/conftest.py), which predict takes from the checkpoint.
    cfg = fast_config(sparse_coco, tmp_path / "eval", resume=trained, **{"test-only": True}, **MODEL_HEADS)
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


def test_an_images_detections_do_not_depend_on_the_other_images(trained: Path, sparse_coco: Path, tmp_path: Path):
    """By default each image gets what it gets alone (a plain torchvision model([image])), however the
    images given with it differ in size: a batch would pad them to its largest."""
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    for i, source in enumerate(sorted((sparse_coco / "val" / "images").iterdir())):
        with Image.open(source) as image:  # portrait and landscape, so that a batch pads one of them
            (image.transpose(Image.Transpose.ROTATE_90) if i % 2 else image).save(photos / f"{i}.png")
    flags = {"resume": trained, "device": "cpu"}

    def by_file(out: Path) -> dict[str, list]:
        files = {i["id"]: Path(i["file_name"]).name for i in json.loads((out / IMAGES_FILE).read_text())["images"]}
        found: dict[str, list] = {name: [] for name in files.values()}
        for record in json.loads((out / RESULTS_FILE).read_text()):
            found[files[record.pop("image_id")]].append(record)
        return found

    predict_images([photos], PredictConfig(out=tmp_path / "together"), flags)
    together = by_file(tmp_path / "together")
    sizes = {Image.open(p).size for p in photos.iterdir()}
    assert len(sizes) > 1 and sum(map(len, together.values())) > 0
    for photo in sorted(photos.iterdir()):
        predict_images([photo], PredictConfig(out=tmp_path / photo.stem), flags)
        assert by_file(tmp_path / photo.stem) == {photo.name: together[photo.name]}, photo.name


def test_a_split_the_split_flags_name_carved_with_the_checkpoints_seed(trained: Path, sparse_coco: Path, tmp_path):
    from maskrcnn_dist.data.sources import DataSources, SplitSource
    from maskrcnn_dist.data.sources.resolve import carve_val

    train_split = SplitSource(sparse_coco / "train" / "annotations.json", sparse_coco / "train" / "images")
    sources = DataSources("flags", {"train": train_split})
    # A run trained with a seed that carves other images than the default's, so that the default
    # cannot pass for the checkpoint's.
    seed = 4242
    default = carve_val(sources, 0.25, build_config(None, {}).seed).splits["val"].image_ids
    expected = carve_val(sources, 0.25, seed).splits["val"].image_ids
    assert set(expected) != set(default)
    checkpoint = torch.load(trained, weights_only=True)
    checkpoint["config"]["seed"] = seed
    checkpoint["trained_model"]["data_flags"]["seed"] = seed
    torch.save(checkpoint, tmp_path / "seeded.pt")
    flags = {
        "resume": tmp_path / "seeded.pt",
        "device": "cpu",
        "train-annotations": train_split.annotations,
        "train-images": train_split.images,
        "val-fraction": 0.25,
    }
    predict_images([], PredictConfig(out=tmp_path / "pred"), flags)
    predicted = json.loads((tmp_path / "pred" / RESULTS_FILE).read_text())
    assert len(expected) == 3 and {r["image_id"] for r in predicted} <= set(expected)
    assert {image["id"] for image in json.loads((tmp_path / "pred" / IMAGES_FILE).read_text())["images"]} == set(
        expected
    )


def test_categories_round_trip_through_the_checkpoint(trained: Path, sparse_coco: Path, tmp_path: Path):
    train_set = open_split(build_config(None, {"data-path": sparse_coco}), "train")
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
    image = [open_split(build_config(None, {"data-path": sparse_coco}), "val")[0][0]]
    torch.testing.assert_close(by_weights.predict(image), old_predictor.predict(image))


# ---------------------------------------------------------------------------------------------------
# inputs and outputs: no drawing replaces another, an input image, or an earlier run's results


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
        write_png(tmp_path / "in" / name)
    images = collect_images([tmp_path / "in"])
    assert len(images) == len(files)
    assert len({item.name.casefold() for item in images}) == len(files), [item.name for item in images]


def test_a_folder_is_searched_outside_the_output_folder(tmp_path: Path):
    write_png(tmp_path / "in" / "a.png")
    write_png(tmp_path / "in" / "pred" / "a.png")  # an earlier run's drawing, under --out
    write_png(tmp_path / "in" / "sub" / "b.PNG")
    (tmp_path / "in" / "notes.txt").write_text("not an image")
    found = collect_images([tmp_path / "in"], out=tmp_path / "in" / "pred")
    assert [item.path.relative_to(tmp_path / "in").as_posix() for item in found] == ["a.png", "sub/b.PNG"]
    assert [item.image_id for item in found] == [1, 2]


def test_an_output_folder_that_is_or_holds_the_input_folder(tmp_path: Path):
    """`--out DIR DIR/`: one line saying why, not "no image files"; `--out .` above the images finds them."""
    write_png(tmp_path / "in" / "a.png")
    with pytest.raises(UserError, match=r"--out .*in/? is the input folder .*in/? itself: the drawings would mix"):
        collect_images([tmp_path / "in/"], out=tmp_path / "in")
    found = collect_images([tmp_path / "in"], out=tmp_path)
    assert [item.path.name for item in found] == ["a.png"]


def test_earlier_predictions_are_refused_or_moved_aside(trained: Path, tmp_path: Path):
    photos = [write_png(tmp_path / "in" / "a" / "x.png"), write_png(tmp_path / "in" / "b" / "x.png")]
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


# ---------------------------------------------------------------------------------------------------
# bad input, through the CLI in a subprocess


def _predict_cli(console, *args: object) -> subprocess.CompletedProcess:
    """`maskrcnn-dist predict` as its own process (the `console` fixture forks it, torch already imported:
    the refusal is the console script's, exit code and standard streams as a user sees them)."""
    argv = ["predict", "--device", "cpu", *map(str, args)]
    result = console("maskrcnn-dist", *argv, env={"PYTHONWARNINGS": "ignore"}, timeout=180)
    return subprocess.CompletedProcess(argv, result.code, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad_inputs")
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (root / "notes.txt").write_text("a text file, not an image\n")
    (root / "garbage.pt").write_bytes(b"not a zip")
    torch.save({"something": 1}, root / "foreign.pt")
    (root / "taken").write_text("a file where the output folder should go\n")
    (root / "empty.png").write_bytes(b"")
    good = write_png(root / "good.png")
    (root / "truncated.png").write_bytes(good.read_bytes()[:-20])
    write_png(root / "thin.png", (256, 1))  # valid, but its short side resizes to 0 px at 96 px
    (root / "no_images").mkdir()
    (root / "no_images" / "notes.txt").write_text("no images here\n")
    (root / "weights.txt").write_text("not a weights file\n")
    write_png(root / "earlier" / "other.png")
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
        ("zero-byte image", r"empty.png: cannot read image: empty file \(0 bytes\)"),
        ("truncated image", r"truncated.png: truncated: the PNG ends inside its IDAT chunk"),
        (
            "thin image",
            r"thin.png: image is too thin for the model: 256x1 resizes to 96x0 at --min-size 96 --max-size 96",
        ),
        ("folder without images", r"no_images: no image files"),
        ("missing image", r"missing.png: no such file or folder"),
        ("text file as weights", r"weights file .*weights.txt is not a PyTorch file"),
        ("drawing over its input", r"--out .*: the drawing of .*good.png would replace that image itself"),
        ("earlier predictions", r"--out .*earlier already holds predictions \(detections.json\): add --overwrite"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(trained: Path, bad_inputs: Path, case: str, message: str, console):
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
        "thin image": ["--resume", trained, "--out", out, bad_inputs / "good.png", bad_inputs / "thin.png"],
        "folder without images": ["--resume", trained, "--out", out, bad_inputs / "no_images"],
        "missing image": ["--resume", trained, "--out", out, bad_inputs / "missing.png"],
        "text file as weights": ["--weights", bad_inputs / "weights.txt", "--out", out, bad_inputs / "good.png"],
        "drawing over its input": ["--resume", trained, "--out", bad_inputs, bad_inputs / "good.png"],
        "earlier predictions": ["--resume", trained, "--out", bad_inputs / "earlier", bad_inputs / "good.png"],
    }[case]
    line = the_error_line(_predict_cli(console, *args))
    assert line.startswith("error: ") and re.search(message, line), line
    assert not out.exists()  # nothing written for a run that was refused
