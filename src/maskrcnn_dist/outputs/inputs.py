"""What predict reads: image files and folders given by themselves (collected, named, checked before
anything is written) or a dataset split's images, each with the frame it is read in."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..data import CocoInstanceDataset
from ..data.images.check import CheckRules, ImageEntry, check_images
from ..data.images.orientation import Frame
from ..errors import DatasetError, UserError

# Files of these kinds are taken from folders (recursively); a file named on the command line is always read.
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
NOTHING_PREDICTED = "fix or remove them; nothing was predicted"


@dataclass(frozen=True)
class InputImage:
    image_id: int
    path: Path
    name: str  # the drawing's file name without suffix, unique within a run


def collect_images(inputs: Sequence[Path], out: Path | None = None) -> list[InputImage]:
    """Image files as given, and the image files in given folders and their subfolders, sorted; ids 1..N
    in that order. A folder is searched outside an `out` inside it: a second run into a folder inside
    its input folder must not predict its own drawings. `out` may not be an input folder itself (its
    drawings would mix with the images)."""
    paths: list[Path] = []
    for given in map(Path, inputs):
        if given.is_dir():
            skip = _output_inside(given, out)
            found = sorted(
                p
                for p in given.rglob("*")
                if p.is_file()
                and p.suffix.lower() in IMAGE_SUFFIXES
                and not (skip is not None and p.resolve().is_relative_to(skip))
            )
            if not found:
                raise UserError(f"{given}: no image files ({' '.join(IMAGE_SUFFIXES)}) in this folder or below")
            paths += found
        elif given.is_file():
            paths.append(given)  # named explicitly: read whatever it is; a non-image fails with its name
        else:
            raise UserError(f"{given}: no such file or folder")
    return _named(list(enumerate(paths, start=1)))


def _output_inside(folder: Path, out: Path | None) -> Path | None:
    """`out`, resolved, when it is a folder strictly inside input `folder` (its files are skipped)."""
    if out is None:
        return None
    inner, outer = Path(out).resolve(), folder.resolve()
    if inner == outer:
        raise UserError(
            f"--out {out} is the input folder {folder} itself: the drawings would mix with its images; "
            "choose another --out (a folder inside it is fine)"
        )
    return inner if inner.is_relative_to(outer) else None


def dataset_images(dataset: CocoInstanceDataset) -> list[InputImage]:
    """A split's images in dataset order (the order of eval's loader)."""
    return _named(list(zip(dataset.image_ids, dataset.file_names(), strict=True)))


def _named(items: list[tuple[int, Path]]) -> list[InputImage]:
    """Drawing names: the file's stem, or stem-<id> where stems repeat (a/x.png and b/x.png). Compared
    case-folded (X.png and x.png are one file on some file systems), and a name another image already
    took (a second x, and a file called x-2) gets the id again, so no drawing replaces another."""
    stems = Counter(path.stem.casefold() for _, path in items)
    taken: set[str] = set()
    named = []
    for iid, path in items:
        name = path.stem if stems[path.stem.casefold()] == 1 else f"{path.stem}-{iid}"
        while name.casefold() in taken:
            name = f"{name}-{iid}"
        taken.add(name.casefold())
        named.append(InputImage(iid, path, name))
    return named


def check_readable(images: list[InputImage], rules: CheckRules) -> dict[int, Frame]:
    """Image files given by themselves: each opens, is whole and fits the model's resize (data/images/
    check.py's check by `rules`), before anything is written. The frames decided, by image id."""
    report = check_images([ImageEntry(i.image_id, i.path) for i in images], rules)
    if report.bad:  # files named by the user: the first one by its name alone, as read_image names it
        bad = report.bad
        more = f" (and {len(bad) - 1} more bad images)" if len(bad) > 1 else ""
        raise DatasetError(f"{bad[0].path}: {bad[0].reason}{more}")
    return dict(report.frames)


def dataset_frames(dataset: CocoInstanceDataset, images: list[InputImage]) -> dict[int, Frame]:
    """The frames a split's images are read in (open_split's check decided them), by image id."""
    return {item.image_id: dataset.frame(item.image_id) for item in images}
