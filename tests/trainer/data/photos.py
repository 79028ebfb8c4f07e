"""Real image files for the orientation and file tests, made with Pillow: a photo-like picture with a red
object in its top-left corner, stored turned under an EXIF orientation (in every container Pillow writes
one to), and broken files of each kind. The stored pixels of an orientation are found with Pillow's own
`ImageOps.exif_transpose` as the oracle, never with the code under test."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, PngImagePlugin

SHOWN = (60, 40)  # width x height of every photo as a viewer shows it
OBJECT = (4, 4, 18, 14)  # x0, y0, x1, y1 of the red object in the shown photo
RED = (255, 0, 0)
XMP = (
    '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    '<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="{o}"/></rdf:RDF></x:xmpmeta>'
)
# container -> (file suffix, how the orientation is written)
CONTAINERS = ("jpeg-exif", "png-exif", "webp-exif", "tiff-tag", "jpeg-xmp", "png-xmp")


def shown_photo(size: tuple[int, int] = SHOWN) -> Image.Image:
    """Grey-brown noise (no pixel is red) with the red OBJECT in the top-left corner."""
    rng = np.random.default_rng(7)
    grey = rng.integers(70, 150, (size[1], size[0], 1))
    pixels = np.concatenate([grey, grey - 10, grey - 20], axis=2).astype(np.uint8)
    x0, y0, x1, y1 = OBJECT
    pixels[y0:y1, x0:x1] = RED
    return Image.fromarray(pixels)


def stored_for(shown: Image.Image, orientation: int) -> Image.Image:
    """The stored pixels that a viewer turns by `orientation` into `shown` (Pillow's exif_transpose)."""
    if orientation == 1:
        return shown.copy()
    for method in Image.Transpose:
        candidate = shown.transpose(method)
        candidate.getexif()[0x0112] = orientation
        if np.array_equal(np.asarray(ImageOps.exif_transpose(candidate)), np.asarray(shown)):
            return shown.transpose(method)
    raise AssertionError(f"no transpose gives orientation {orientation}")


def encode(stored: Image.Image, container: str, orientation: int) -> bytes:
    """`stored` in `container` (CONTAINERS) with `orientation` written where that container keeps it."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    xmp = XMP.format(o=orientation)
    buffer = io.BytesIO()
    if container == "jpeg-exif":
        stored.save(buffer, "JPEG", quality=95, exif=exif)
    elif container == "png-exif":
        stored.save(buffer, "PNG", exif=exif)  # an eXIf chunk
    elif container == "webp-exif":
        stored.save(buffer, "WEBP", lossless=True, exif=exif)
    elif container == "tiff-tag":
        stored.save(buffer, "TIFF", tiffinfo={0x0112: orientation})  # tag 274 in the IFD
    elif container == "jpeg-xmp":
        stored.save(buffer, "JPEG", quality=95, xmp=xmp.encode())
    elif container == "png-xmp":
        info = PngImagePlugin.PngInfo()
        info.add_itxt("XML:com.adobe.xmp", xmp)
        stored.save(buffer, "PNG", pnginfo=info)
    else:
        raise ValueError(container)
    return buffer.getvalue()


def red_box(image: Image.Image) -> tuple[int, int, int, int]:
    """x0, y0, x1, y1 of the red pixels of an image (where an annotation tool would draw the object)."""
    pixels = np.asarray(image.convert("RGB")).astype(int)
    ys, xs = np.nonzero((pixels[..., 0] > 200) & (pixels[..., 1] < 60) & (pixels[..., 2] < 60))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def write_coco(root: Path, images: list[tuple[str, bytes, tuple[int, int], tuple[int, int, int, int] | None]]) -> Path:
    """A one-category COCO split at `root`: (file name, bytes, annotated width x height, the object's
    box or None) per image, ids 1..N; each box is also the object's polygon. Returns the JSON's path."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for image_id, (name, data, size, box) in enumerate(images, start=1):
        (root / "images" / name).write_bytes(data)
        records.append({"id": image_id, "file_name": name, "width": size[0], "height": size[1]})
        if box is not None:
            x0, y0, x1, y1 = box
            polygon = [x0, y0, x1, y0, x1, y1, x0, y1]
            bbox = [x0, y0, x1 - x0, y1 - y0]
            annotations.append(
                {"id": image_id, "image_id": image_id, "category_id": 1, "bbox": bbox, "segmentation": [polygon]}
            )
    data = {"images": records, "annotations": annotations, "categories": [{"id": 1, "name": "object"}]}
    (root / "annotations.json").write_text(json.dumps(data))
    return root / "annotations.json"


# ---------------------------------------------------------------------------------------------------
# broken files


def png_bytes(size: tuple[int, int] = (40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
        buffer, "PNG"
    )
    return buffer.getvalue()


def png_chunks(data: bytes) -> list[tuple[bytes, int, int]]:
    """(type, offset, data length) of every chunk."""
    chunks, pos = [], 8
    while pos < len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        chunks.append((kind, pos, length))
        pos += 12 + length
    return chunks


def corrupt_idat(data: bytes, fix_crc: bool) -> bytes:
    """The PNG with 40 bytes of its zlib stream inverted; its CRC recomputed (`fix_crc`) or left stale."""
    _, pos, length = next(c for c in png_chunks(data) if c[0] == b"IDAT")
    spoiled = bytearray(data)
    for i in range(pos + 8 + 20, pos + 8 + 60):
        spoiled[i] ^= 0xFF
    if fix_crc:
        struct.pack_into(">I", spoiled, pos + 8 + length, zlib.crc32(bytes(spoiled[pos + 4 : pos + 8 + length])))
    return bytes(spoiled)


def bmp_claiming(size: tuple[int, int], keep: int = 57) -> bytes:
    """A BMP header that claims `size` pixels, in `keep` bytes."""
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "BMP")
    header = bytearray(buffer.getvalue())
    struct.pack_into("<ii", header, 18, *size)
    return bytes(header[:keep])
