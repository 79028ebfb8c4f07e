"""EXIF orientation: the frame an image is read in, decided by one function for the data check, the
loader, predict and the gallery alike, and Pillow's transposes between the frames.

A file's pixels are stored in one frame; its EXIF orientation (JPEG and WebP EXIF, PNG eXIf, TIFF tag
274, or XMP `tiff:Orientation`: wherever `Image.getexif()` finds it) says how a viewer turns them to
show the image. Annotation tools (CVAT, LabelMe, Roboflow, browsers) show the turned image and export
annotations in that display frame. `decide_frame` reads an image in the frame its annotation's width x
height belongs to:

    auto    the display frame when the annotation's size is the shown size (orientations 2-4 and
            square images keep the size: the display frame, as the tools do); the stored frame when
            the orientation turns the image (5-8) and the size is only the stored one
    apply   always the display frame
    ignore  always the stored pixels (orientation 1 for every file)

A size that fits neither is refused with a reason that names the orientation.

Pillow turns a TIFF's pixels by its orientation itself as it decodes them (and then forgets the
orientation); `load_oriented` notices, and `in_frame` turns such pixels back where the frame decided
is the stored one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import ExifTags, Image

# PIL.ImageOps.exif_transpose's table (Pillow keeps it inside that function): orientation -> the
# transpose that turns the stored pixels into the display frame. tests/trainer/data/test_orientation.py
# checks it against exif_transpose itself, orientation by orientation.
DISPLAY_TRANSPOSE: dict[int, Image.Transpose] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
TURNED = (5, 6, 7, 8)  # the orientations that swap width and height
# The transposes back: each is its own inverse but the two quarter turns.
_INVERSE = {
    Image.Transpose.ROTATE_90: Image.Transpose.ROTATE_270,
    Image.Transpose.ROTATE_270: Image.Transpose.ROTATE_90,
}
STORED_TRANSPOSE: dict[int, Image.Transpose] = {o: _INVERSE.get(t, t) for o, t in DISPLAY_TRANSPOSE.items()}


class FrameMismatch(ValueError):
    """The annotation's width x height fits no frame the --exif-orientation setting allows; the
    message is the reason, naming the orientation."""


@dataclass(frozen=True)
class Frame:
    """How an image is read. `applied`: the orientation whose transpose turns the stored pixels into
    the frame read (1: as stored). `to_display`: the orientation that still turns the frame read into
    the display frame, for drawings (1: the frame read is the display frame, or the orientation is
    ignored)."""

    applied: int = 1
    to_display: int = 1

    @property
    def read_as_stored_though_turned(self) -> bool:
        """Read as stored although a viewer shows the image turned (auto, annotation in the stored frame)."""
        return self.applied == 1 and self.to_display in TURNED


AS_STORED = Frame()


@dataclass(frozen=True)
class Oriented:
    """An opened image's frames: its stored pixels' width x height, the orientation a viewer applies
    (1: none), and the orientation Pillow has already applied to the pixels it decoded (1, or
    `orientation` for a TIFF)."""

    stored: tuple[int, int]
    orientation: int = 1
    delivered: int = 1


def load_oriented(image: Image.Image, decode: bool = True) -> Oriented:
    """Decode `image` (unless `decode` is False) and read its orientation: before decoding, since
    Pillow applies a TIFF's as it decodes it and then drops it, but a PNG's after (Pillow finds an eXIf
    chunk that follows the pixels only by decoding them, and a decoding error must not be swallowed
    here). A decoding error is raised as the decoder raised it."""
    before = None if image.format == "PNG" else read_orientation(image)
    if decode:
        image.load()
    after = read_orientation(image)
    if before is not None and before != 1 and after == 1:  # Pillow turned the pixels as it decoded them
        return Oriented(shown_size(image.size, before), before, delivered=before)
    return Oriented(image.size, after)


def read_orientation(image: Image.Image) -> int:
    """The orientation a viewer applies to `image`: 2-8, or 1 for none, an invalid value, or EXIF that
    cannot be parsed (viewers ignore those too)."""
    try:
        value = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # noqa: BLE001 - malformed EXIF of any kind: no orientation, as for a viewer
        return 1
    return value if isinstance(value, int) and value in DISPLAY_TRANSPOSE else 1


def shown_size(stored: tuple[int, int], orientation: int) -> tuple[int, int]:
    """Width x height of an image stored `stored` as a viewer shows it."""
    return (stored[1], stored[0]) if orientation in TURNED else stored


def decide_frame(stored: tuple[int, int], orientation: int, annotated: tuple[int, int] | None, policy: str) -> Frame:
    """The frame to read an image in (module docstring), from its stored size, its orientation, the
    annotation's width x height (None: a file given by itself, read as shown) and --exif-orientation.
    Raises FrameMismatch when the annotation's size fits no frame the policy allows."""
    shown = shown_size(stored, orientation)
    if policy == "ignore":
        frame, size = AS_STORED, stored
    elif policy == "auto" and orientation in TURNED and annotated == stored != shown:
        frame, size = Frame(applied=1, to_display=orientation), stored
    else:
        frame, size = Frame(applied=orientation), shown
    if annotated is not None and annotated != size:
        raise FrameMismatch(mismatch_reason(stored, orientation, annotated, policy))
    return frame


def mismatch_reason(stored: tuple[int, int], orientation: int, annotated: tuple[int, int], policy: str) -> str:
    """Why an image's size does not fit its annotation; an orientation other than 1 is named."""
    says = f"the annotation file says {annotated[0]}x{annotated[1]}"
    if orientation == 1:
        return f"image is {stored[0]}x{stored[1]} but {says}"
    shown = shown_size(stored, orientation)
    reason = (
        f"image is stored {stored[0]}x{stored[1]} with EXIF orientation {orientation} "
        f"(shown {shown[0]}x{shown[1]}); {says}"
    )
    if policy == "ignore" and annotated == shown:
        return f"{reason}, the shown size: --exif-orientation ignore reads it as stored (auto or apply: as shown)"
    if policy == "apply" and annotated == stored:
        return f"{reason}, the stored size: --exif-orientation apply reads it as shown (auto or ignore: as stored)"
    return reason


def frame_of(oriented: Oriented, annotated: tuple[int, int] | None, policy: str) -> Frame:
    """decide_frame for a loaded image (load_oriented). The data check and the loader both call this,
    so they cannot decide differently."""
    return decide_frame(oriented.stored, oriented.orientation, annotated, policy)


def frame_size(stored: tuple[int, int], frame: Frame) -> tuple[int, int]:
    """Width x height of an image stored `stored`, read in `frame`."""
    return shown_size(stored, frame.applied)


def in_frame(image: Image.Image, frame: Frame, delivered: int = 1) -> Image.Image:
    """The decoded pixels of `image` (turned by `delivered`, Oriented.delivered) in `frame`."""
    if frame.applied == delivered:
        return image
    if delivered == 1:
        return image.transpose(DISPLAY_TRANSPOSE[frame.applied])
    return image.transpose(STORED_TRANSPOSE[delivered])  # frame.applied is 1: back to the stored pixels


def to_display(drawing: torch.Tensor, frame: Frame) -> torch.Tensor:
    """A uint8 [3, H, W] drawing made on the frame read, turned into the display frame."""
    if frame.to_display == 1:
        return drawing
    pixels = Image.fromarray(np.ascontiguousarray(drawing.permute(1, 2, 0).numpy()))
    turned = pixels.transpose(DISPLAY_TRANSPOSE[frame.to_display])
    return torch.from_numpy(np.asarray(turned).copy()).permute(2, 0, 1)
