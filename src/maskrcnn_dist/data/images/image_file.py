"""One image file: opened and vouched for by the data check, and read into pixels by the loader, with
reasons that say what is wrong with it.

What the check vouches for without decoding (`open_checked`):
    JPEG (and MPO)  its end-of-image marker: JPEG's entropy-coded data escapes every 0xFF, so FF D9
                    appears only as the end marker; a truncated JPEG lacks it. libjpeg decodes
                    corrupt scan data with a warning, so decoding proves no more. Without the marker
                    in its last 4 KiB the JPEG is decoded: a phone's motion photo appends a video
                    after the image.
    PNG             every chunk is complete and matches its CRC, and IEND ends the file; then the
                    pixels are decoded (a zlib stream can be broken under good CRCs).
    WebP            the file holds the bytes its RIFF header announces; then decoded.
    anything else   (BMP, TIFF, GIF, ...) decoded: no end marker proves these whole.
"truncated" means the data ends early; a corrupt stream, a CRC error and a PNG that only lacks IEND
are named as such.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ...errors import DatasetError, one_line
from .orientation import Frame, FrameMismatch, Oriented, frame_of, in_frame, load_oriented

END_MARKED = ("JPEG", "MPO")  # formats whose end marker proves the file whole
_TAIL_BYTES = 4096
_JPEG_END = b"\xff\xd9"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class ImageFault(Exception):
    """The file cannot be used for training; the message is the reason."""


@contextmanager
def open_checked(path: Path, decode_all: bool = False) -> Iterator[tuple[Image.Image, Oriented]]:
    """`path` opened by Pillow once its format's checks pass (module docstring), decoded unless it is a
    JPEG proven whole by its end marker (`decode_all`: decoded whatever its format), with its frames.
    ImageFault otherwise."""
    try:
        file_size = path.stat().st_size
        image = Image.open(path)
    except FileNotFoundError as exc:
        raise ImageFault("file not found") from exc
    except UnidentifiedImageError as exc:
        what = "empty file (0 bytes)" if file_size == 0 else "not an image file Pillow can read"
        raise ImageFault(f"cannot read image: {what}") from exc
    except Exception as exc:  # noqa: BLE001 - any failure to open the file is a verdict on the file
        _riff_complete(path, file_size)  # Pillow cannot open a cut WebP
        raise ImageFault(f"cannot read image: {one_line(exc)}") from exc
    with image:
        marked = image.format in END_MARKED and _ends_with(image, _JPEG_END)
        has_end = True
        if image.format == "PNG":
            has_end = _png_chunks(path)
        elif image.format == "WEBP":
            _riff_complete(path, file_size)
        try:
            oriented = load_oriented(image, decode=decode_all or not marked)
        except Exception as exc:  # noqa: BLE001 - as above
            reason = decode_failure(exc, image, file_size)
            if image.format in END_MARKED and reason.startswith("truncated"):
                reason = "truncated: the JPEG ends without its end-of-image marker (FF D9)"
            raise ImageFault(reason) from exc
        if not has_end:
            raise ImageFault("the PNG has no IEND chunk: its image data is complete, the end chunk is missing")
        yield image, oriented


def decode_failure(exc: BaseException, image: Image.Image, file_size: int) -> str:
    """The reason for a decoder's exception on `image`: truncated (the data ended early), a corrupt
    stream, or the decoder's own words."""
    text = one_line(exc)
    if "truncated" in text.lower() or isinstance(exc, EOFError):
        return f"truncated: the file ({file_size} bytes) ends before its {image.width}x{image.height} pixels"
    if "broken data stream" in text:
        stream = "zlib stream" if image.format == "PNG" else f"{image.format} data"
        return f"corrupt image data: broken {stream}"
    return f"cannot decode image: {text}"


def _ends_with(image: Image.Image, marker: bytes) -> bool:
    fp = image.fp
    assert fp is not None  # an image opened from a path keeps its file open until loaded
    fp.seek(0, 2)
    fp.seek(max(0, fp.tell() - _TAIL_BYTES))
    return marker in fp.read()


def _png_chunks(path: Path) -> bool:
    """Walk the PNG's chunks: ImageFault when one is cut off (truncated) or fails its CRC (corrupt);
    whether IEND was reached."""
    data = memoryview(path.read_bytes())
    pos = len(_PNG_SIGNATURE)
    while pos < len(data):
        if pos + 8 > len(data):
            raise ImageFault(f"truncated: the PNG ends inside a chunk header at byte {pos} of {len(data)}")
        length, kind = struct.unpack_from(">I4s", data, pos)
        name = kind.decode("latin-1")
        end = pos + 12 + length
        if end > len(data):
            raise ImageFault(f"truncated: the PNG ends inside its {name} chunk at byte {pos} ({len(data)} bytes)")
        (crc,) = struct.unpack_from(">I", data, end - 4)
        if zlib.crc32(data[pos + 4 : end - 4]) != crc:
            raise ImageFault(f"corrupt data: the PNG's {name} chunk at byte {pos} fails its CRC check")
        if kind == b"IEND":
            return True
        pos = end
    return False


def _riff_complete(path: Path, file_size: int) -> None:
    """ImageFault when a WebP holds fewer bytes than its RIFF header announces."""
    try:
        with open(path, "rb") as f:
            header = f.read(12)
    except OSError:  # unreadable: the caller's reason stands
        return
    if len(header) < 12 or header[:4] != b"RIFF" or header[8:] != b"WEBP":
        return
    announced = struct.unpack_from("<I", header, 4)[0] + 8
    if file_size < announced:
        raise ImageFault(f"truncated: the WebP's RIFF header announces {announced} bytes, the file has {file_size}")


# ---------------------------------------------------------------------------------------------------
# the loader's read


def read_image(
    path: Path,
    frame: Frame | None = None,
    *,
    annotated: tuple[int, int] | None = None,
    policy: str = "auto",
    name: str | None = None,
) -> tuple[torch.Tensor, Frame]:
    """An image file as float32 [3, H, W] in [0, 1], read in `frame`, and that frame. `frame` None:
    decided now from the file (orientation.frame_of: the data check's function, with the annotation's
    width x height `annotated` and --exif-orientation `policy`), as when --check-data is off. A
    DatasetError names the file (`name`) when it cannot be decoded or fits no frame."""
    name = name or str(path)
    try:
        with Image.open(path) as im:
            try:
                oriented = load_oriented(im)  # decode now, so a truncated file fails here with its name
            except Exception as exc:  # noqa: BLE001 - the check's reason for the same failure
                raise DatasetError(f"{name}: {decode_failure(exc, im, path.stat().st_size)}") from exc
            if frame is None:
                frame = frame_of(oriented, annotated, policy)
            array = _to_rgb_float(in_frame(im, frame, oriented.delivered))
    except FrameMismatch as exc:
        raise DatasetError(f"{name}: {exc}") from exc
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{name}: cannot read image: {one_line(exc)}") from exc
    return torch.from_numpy(array).permute(2, 0, 1).contiguous(), frame


def _to_rgb_float(im: Image.Image) -> np.ndarray:
    """Any PIL mode -> float32 HxWx3 in [0, 1]."""
    if im.mode.startswith("I"):  # 16/32-bit grayscale: PIL's convert("RGB") would clip it to 255
        gray = np.clip(np.asarray(im, dtype=np.float32) / 65535.0, 0.0, 1.0)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")  # PIL asks for this route for palettes with transparency
    return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
