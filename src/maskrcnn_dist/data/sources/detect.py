"""Find a dataset's splits under --data-path as an annotation tool exported it.

No list of layouts: one rule over the files. Every JSON file under the folder that is a COCO instances
file (images, annotations, categories; not captions or keypoints) is a split; its image folder is the
folder under --data-path where its file_names are found by the file_name rule (data/sources/file_names.py),
preferring the one where most are found, then the one named like the split, then the one needing the
fewest prefixes dropped, then the one nearest the file; its split is the first split name in the file's
name, then in its folders' names, nearest first (aliases below: `valid`, `Validation`, `val2017`, ...).
A file naming no split (`instances_default.json`, `result.json`, `labels.json`) is the train split when
it is the only one.
Two files for one split is an error listing both and the flags that choose.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import DatasetError
from . import DataSources, SplitSource, input_folder_problem
from .file_names import name_parts, stripped

log = logging.getLogger(__name__)

ALIASES = {
    **dict.fromkeys(("train", "training", "trainval", "trn"), "train"),
    **dict.fromkeys(("val", "valid", "validation", "dev", "minival", "eval"), "val"),
    **dict.fromkeys(("test", "testing", "testdev"), "test"),
}
MAX_DEPTH = 6  # folders below --data-path that are searched (Label Studio's upload paths are deep)
MAX_PARSED = 64 << 20  # larger JSON files are judged by their first PEEK bytes (COCO's train)
PEEK = 8 << 20
SAMPLE = 16  # file_names per file that place its image folder
SKIPPED = ("__MACOSX",)
FLAGS_HINT = "pass --train-annotations FILE --train-images DIR (and --val-annotations FILE --val-images DIR)"

# Only for the log line: which tool's export the files look like (the rule above does not depend on it).
TOOL_NAMES = (
    (r"(^|/)_annotations\.coco\.json$", "Roboflow COCO"),
    (r"(^|/)instances_default\.json$", "CVAT COCO 1.0"),
    (r"(^|/)instances_[A-Za-z]+\.json$", "CVAT/Datumaro COCO with subsets"),
    (r"(^|/)instances_[a-z]+20\d\d\.json$", "COCO 2017"),
    (r"(^|/)result\.json$", "Label Studio COCO"),
    (r"(^|/)labels\.json$", "FiftyOne COCO"),
    (r"^(train|val)/annotations\.json$", "maskrcnn-dist (synth-data)"),
)


@dataclass(frozen=True)
class Found:
    """A COCO instances file under the folder, its split, and where its images are (None: nowhere)."""

    annotations: Path
    split: str | None
    images: Path | None
    example: str  # one of its file_names, for messages

    def describe(self) -> str:
        return f"{self.annotations} + {self.images}/" if self.images else f"{self.annotations} (images not found)"


def split_of(relative: Path) -> str | None:
    """The split a file's name, then its folders' names (nearest first), say; None when none does."""
    stem = relative.name.split(".")[0]
    for name in (stem, *reversed(relative.parent.parts)):
        for token in re.split(r"[^a-z0-9]+", name.lower()):
            if (split := ALIASES.get(token.rstrip("0123456789"))) is not None:
                return split
    return None


def _walk(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """(folder, its file names) for every folder to MAX_DEPTH below root, hidden ones left out. Linked
    folders are followed (a split linked in from elsewhere is a split); MAX_DEPTH bounds a link loop."""
    for folder, dirs, files in os.walk(root, followlinks=True):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED and depth < MAX_DEPTH)
        yield here, files


def coco_file_names(path: Path) -> list[str] | None:
    """The first file_names of a COCO instances file (none when it lists no image), or None when
    `path` is not one."""
    try:
        if path.stat().st_size <= MAX_PARSED:
            text = path.read_text(encoding="utf-8")
            # Not parsed unless it can be one: a labelme folder holds a JSON file per image.
            return _instance_names(json.loads(text)) if '"images"' in text else None
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(PEEK)
    except (OSError, ValueError):
        return None
    if '"images"' not in head or '"caption"' in head or '"keypoints"' in head:
        return None
    return [json.loads(f'"{m}"') for m in re.findall(r'"file_name"\s*:\s*"((?:[^"\\]|\\.)*)"', head)[:SAMPLE]] or None


def broken_split_file(root: Path, others: list[Path], split: str) -> str | None:
    """The problem of a JSON file that would be `split`'s (named like it, or the only JSON file) but
    cannot be parsed: a damaged annotation file is named as such, not taken for "no split"."""
    for path in others:
        if split_of(path.relative_to(root)) != split and len(others) > 1:
            continue
        try:
            if path.stat().st_size <= MAX_PARSED:
                json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return f"{path}: not valid JSON: {e}"
        except OSError as e:
            return f"{path}: cannot read annotation file: {e}"
    return None


def _instance_names(data: object) -> list[str] | None:
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "categories")):
        return None
    annotations, categories = data.get("annotations"), data["categories"]
    if not isinstance(annotations, list) or not categories:
        return None
    if any(isinstance(c, dict) and "keypoints" in c for c in categories):
        return None  # a keypoints file: its instances file is beside it
    if annotations and not (isinstance(annotations[0], dict) and "category_id" in annotations[0]):
        return None  # captions
    names = [img.get("file_name") for img in data["images"][:SAMPLE] if isinstance(img, dict)]
    return [n for n in names if isinstance(n, str) and n]  # empty: a file listing no images (refused later)


def image_folder(
    names: list[str], folders_with: dict[str, set[Path]], split: str | None, root: Path, annotations: Path
) -> Path | None:
    """The folder where most of `names` are found by the file_name rule (ties: named like the split,
    then the fewest prefixes dropped, then the nearest to the `annotations` file, then the shallowest);
    None when none is found anywhere. Nearness matters where a folder holds copies of one set."""
    candidates: set[Path] = set()
    for name in names:
        parts = name_parts(name)
        for folder in folders_with.get(parts[-1], ()) if parts else ():
            for k in range(len(parts)):  # the folder the name resolves in after dropping k prefixes
                inner = parts[k:-1]
                if folder.parts[len(folder.parts) - len(inner) :] == inner:
                    candidates.add(folder.parents[len(inner) - 1] if inner else folder)
    candidates = {c for c in candidates if c.is_relative_to(root)}

    def rank(folder: Path) -> tuple[int, bool, int, int, int]:
        drops = [stripped(folder, name) for name in names]
        found = [d for d in drops if d is not None]
        named = split is not None and any(split_of(Path(part)) == split for part in folder.parts[-2:])
        shared = len(Path(os.path.commonpath([folder, annotations.parent])).parts)
        return len(found), named, -sum(found), shared, -len(folder.parts)

    return max(sorted(candidates), key=rank, default=None)


def find_files(root: Path) -> tuple[list[Found], list[Path]]:
    """Every COCO instances file under `root` with its split and image folder, and the other JSON files."""
    listings = list(_walk(root))
    jsons = [folder / name for folder, files in listings for name in files if name.lower().endswith(".json")]
    instances, others = [], []
    for path in sorted(jsons):
        names = coco_file_names(path)
        if names is None:
            others.append(path)
        else:
            instances.append((path, names))
    # Where each sampled file name is (only those: an index of every file costs more).
    wanted = {parts[-1] for _, names in instances for name in names if (parts := name_parts(name))}
    index: dict[str, set[Path]] = {}
    for folder, files in listings:
        for name in wanted.intersection(files):
            index.setdefault(name, set()).add(folder)
    found = []
    for path, names in instances:
        split = split_of(path.relative_to(root))
        images = image_folder(names, index, split, root, path) if names else path.parent  # no image to place it by
        found.append(Found(path, split, images, names[0] if names else ""))
    return found, others


def tool_name(root: Path, found: list[Found]) -> str:
    for pattern, name in TOOL_NAMES:
        if any(re.search(pattern, f.annotations.relative_to(root).as_posix()) for f in found):
            return name
    return "COCO instances files"


def detect(root: Path, announce: bool = True) -> DataSources:
    """The train and val splits under `root` (val may be missing), or a DatasetError that helps.
    `announce`: log what was found (and a val split left out)."""
    takes = (
        "the folder the dataset was exported into (one annotation file goes to --train-annotations, with "
        "--train-images for its images)"
    )
    if problem := input_folder_problem(root, "--data-path", takes):
        raise DatasetError(problem)
    found, others = find_files(root)
    by_split: dict[str | None, list[Found]] = {}
    for f in found:
        by_split.setdefault(f.split, []).append(f)
    train = _one(root, "train", by_split.get("train") or by_split.get(None) or [])
    if train is None:
        raise DatasetError(broken_split_file(root, others, "train") or refusal(root, found, others))
    if train.images is None:
        raise DatasetError(
            f"--data-path {root}: {train.annotations} lists images (e.g. {train.example!r}) that are in no folder "
            f"under {root}: pass --train-annotations {train.annotations} --train-images DIR"
        )
    splits = {"train": SplitSource(train.annotations, train.images)}
    val = _one(root, "val", by_split.get("val", []))
    if val is None and (problem := broken_split_file(root, others, "val")):
        raise DatasetError(problem)
    if val is not None and val.images is None:
        if announce:
            log.warning("--data-path %s: %s: none of its images is under %s; no val split", root, val.annotations, root)
    elif val is not None:
        splits["val"] = SplitSource(val.annotations, val.images)
    sources = DataSources(tool_name(root, found), splits)
    if not announce:
        return sources
    log.info("--data-path %s: %s layout", root, sources.layout)
    for name, source in splits.items():
        log.info("  %s: %s", name, source.describe())
    if unused := [f for f in found if f.annotations not in {s.annotations for s in splits.values()}]:
        log.info("  not used: %s", "; ".join(str(f.annotations) for f in unused))
    return sources


def _one(root: Path, split: str, found: list[Found]) -> Found | None:
    if len(found) > 1:
        listed = "; ".join(f.describe() for f in found)
        raise DatasetError(
            f"--data-path {root}: {len(found)} files could be the {split} split: {listed}; pass "
            f"--{split}-annotations FILE --{split}-images DIR to choose"
        )
    return found[0] if found else None


def refusal(root: Path, found: list[Found], others: list[Path]) -> str:
    """Why no train split was found: what the folder looks like instead, and the flags to pass."""
    head = f"--data-path {root}: no train split found"
    if found:
        listed = "; ".join(f"{f.annotations} ({f.split} split)" for f in found)
        return f"{head}: the COCO files there are {listed}; {FLAGS_HINT}"
    return f"{head}: {closest_layout(root, others)}; {FLAGS_HINT}"


def closest_layout(root: Path, others: list[Path]) -> str:
    """What a folder with no COCO instances file resembles, for the refusal."""
    if any(_has_key(path, '"shapes"') for path in others[:20]):
        return "its JSON files are labelme's per-image annotations, not COCO: convert them with labelme2coco"
    if any(root.glob("*/*.xml")) or (root / "Annotations").is_dir():
        return "it looks like Pascal VOC (XML annotations), not COCO: export COCO from your annotation tool"
    if (root / "data.yaml").is_file() or any(root.glob("**/labels/*.txt")):
        return "it looks like a YOLO export (data.yaml, labels/*.txt), not COCO: export COCO instead"
    if others:
        return f"none of its {len(others)} JSON files is a COCO instances file (images, annotations, categories)"
    return "it holds no JSON file (a COCO export has an instances JSON beside or above its images)"


def _has_key(path: Path, key: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return key in f.read(1 << 16)
    except OSError:
        return False
