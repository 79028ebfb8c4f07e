"""One rule for an image's `file_name`: relative to its split's image folder.

Annotation tools write it with prefixes of their own: Label Studio `images/x.jpg` or
`../../data/upload/3/x.jpg`, labelme's converter `JPEGImages/x.jpg`, CVAT's project sub-folders,
Windows separators. So when FOLDER/file_name is not a file, the leading folders of file_name are
dropped one at a time (FOLDER/images/x.jpg, then FOLDER/x.jpg). The first that is a file is the image;
when none is, the image is FOLDER/file_name as written (where a missing file is reported).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


def name_parts(file_name: str) -> tuple[str, ...]:
    """file_name's folders and name, separators of either kind, without `.`, `..` or a drive."""
    path = PurePosixPath(file_name.replace("\\", "/"))
    return tuple(part for part in path.parts if part not in ("/", ".", "..") and not part.endswith(":"))


def candidates(folder: Path, file_name: str) -> list[Path]:
    """Where the rule looks for `file_name`, in order (an absolute name first as written)."""
    parts = name_parts(file_name)
    tried = [Path(file_name)] if Path(file_name).is_absolute() else []
    return tried + [folder.joinpath(*parts[i:]) for i in range(len(parts))]


def resolve_image(folder: Path, file_name: str) -> tuple[Path, bool]:
    """(the image's path, whether it is a file) by the rule above."""
    if _plain(file_name):  # the rule's first candidate is FOLDER/file_name as written: most names, found at once
        path = folder / file_name
        if path.is_file():
            return path, True
    looked = candidates(folder, file_name)
    for path in looked:
        if path.is_file():
            return path, True
    return folder / file_name, False  # an absolute file_name stays itself


def image_path(folder: Path, file_name: str) -> Path:
    """resolve_image's path alone. A plain name of one part has nothing to drop: it is FOLDER/file_name
    whether or not that is a file, so it is not looked for (a stat per image adds up over a large set)."""
    if "/" not in file_name and _plain(file_name):
        return folder / file_name
    return resolve_image(folder, file_name)[0]


def _plain(file_name: str) -> bool:
    """A relative name of plain parts (no `.`, `..`, empty part, drive or backslash): `candidates` would
    look at FOLDER/file_name first. (A shortcut: COCO's images are named so.)"""
    if not file_name or "\\" in file_name or ":" in file_name or file_name.startswith("/"):
        return False
    if "/" not in file_name:  # one part, most names: no split (this runs once per image at a start)
        return file_name not in (".", "..")
    return all(part not in ("", ".", "..") for part in file_name.split("/"))


def stripped(folder: Path, file_name: str) -> int | None:
    """How many leading folders of file_name the rule drops to find it in `folder` (None: not found)."""
    parts = name_parts(file_name)
    for i in range(len(parts)):
        if folder.joinpath(*parts[i:]).is_file():
            return i
    return None
