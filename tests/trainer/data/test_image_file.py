"""One image file (data/images/image_file.py): the header check decodes what no end marker vouches for, names
what is wrong (truncated only when the data ends early), and the loader gives a decode failure the same
reason; valid files of every kind Pillow reads pass and load."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from maskrcnn_dist.data import read_image
from maskrcnn_dist.data.images.check import CheckRules, ImageEntry, check_image
from maskrcnn_dist.data.images.orientation import AS_STORED
from maskrcnn_dist.errors import DatasetError

from .photos import bmp_claiming, corrupt_idat, png_bytes, png_chunks


def _encoded(fmt: str, image: Image.Image | None = None, **params) -> bytes:
    buffer = io.BytesIO()
    (image or Image.fromarray(np.random.default_rng(2).integers(0, 255, (30, 40, 3), dtype=np.uint8))).save(
        buffer, fmt, **params
    )
    return buffer.getvalue()


def _broken_files() -> dict[str, tuple[bytes, str]]:
    """file name -> (its bytes, the reason the check gives, exactly or as its start)."""
    png = png_bytes()
    idat_at = next(pos for kind, pos, _ in png_chunks(png) if kind == b"IDAT")
    jpeg, webp, gif = _encoded("JPEG"), _encoded("WEBP"), _encoded("GIF")
    return {
        "zlib.png": (corrupt_idat(png, fix_crc=True), "corrupt image data: broken zlib stream"),
        "crc.png": (corrupt_idat(png, fix_crc=False), f"corrupt data: the PNG's IDAT chunk at byte {idat_at} fails"),
        "no-iend.png": (png[:-12], "the PNG has no IEND chunk: its image data is complete, the end chunk is missing"),
        "half.png": (png[: len(png) // 2], f"truncated: the PNG ends inside its IDAT chunk at byte {idat_at}"),
        "half.jpg": (jpeg[: len(jpeg) // 2], "truncated: the JPEG ends without its end-of-image marker (FF D9)"),
        "huge.bmp": (bmp_claiming((12300, 12300)), "truncated: the file (57 bytes) ends before its 12300x12300 pixels"),
        "half.webp": (webp[: len(webp) // 2], "truncated: the WebP's RIFF header announces"),
        "half.gif": (gif[: len(gif) // 2], "truncated: the file"),
        "empty.png": (b"", "cannot read image: empty file (0 bytes)"),
        "text.png": (b"not an image at all\n", "cannot read image: not an image file Pillow can read"),
    }


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("mode", ["header", "full"])
def test_each_broken_file_has_the_reason_that_says_what_is_wrong(tmp_path: Path, mode: str):
    for name, (data, reason) in _broken_files().items():
        (tmp_path / name).write_bytes(data)
        verdict = check_image(ImageEntry(1, tmp_path / name), CheckRules(mode))
        assert isinstance(verdict, str) and verdict.startswith(reason), (name, verdict)
        assert ("truncated" in verdict) == name.startswith(("half", "huge")), (name, verdict)


def test_the_loader_gives_a_decode_failure_the_checks_reason(tmp_path: Path):
    """--check-data off: the file fails where it is read, with its name and the same reason."""
    for name in ("zlib.png", "huge.bmp"):
        data, reason = _broken_files()[name]
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DatasetError) as info:
            with pytest.warns(Image.DecompressionBombWarning) if name == "huge.bmp" else _nothing():
                read_image(tmp_path / name, name=f"{name} (image id 3)")
        assert str(info.value).startswith(f"{name} (image id 3): {reason}"), str(info.value)


class _nothing:
    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...


def _valid_files() -> dict[str, bytes]:
    rng = np.random.default_rng(3)
    rgb = Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8))
    other = Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8))
    palette = rgb.convert("P")
    sixteen = Image.fromarray((rng.integers(0, 65535, (30, 40))).astype(np.uint16))
    return {
        "1x1.png": _encoded("PNG", Image.new("RGB", (1, 1), (9, 9, 9))),
        "1x1.jpg": _encoded("JPEG", Image.new("RGB", (1, 1))),
        "16bit.png": _encoded("PNG", sixteen),
        "16bit.tif": _encoded("TIFF", sixteen),
        "palette-trns.png": _encoded("PNG", palette, transparency=0),
        "la.png": _encoded("PNG", rgb.convert("LA")),
        "bilevel.png": _encoded("PNG", rgb.convert("1")),
        "cmyk.jpg": _encoded("JPEG", rgb.convert("CMYK")),
        "progressive.jpg": _encoded("JPEG", rgb, progressive=True),
        "apng.png": _encoded("PNG", rgb, save_all=True, append_images=[other]),
        "multipage.tif": _encoded("TIFF", rgb, save_all=True, append_images=[other]),
        "lzw.tif": _encoded("TIFF", rgb, compression="tiff_lzw"),
        "animated.gif": _encoded("GIF", palette, save_all=True, append_images=[other.convert("P")]),
        "animated.webp": _encoded("WEBP", rgb, save_all=True, append_images=[other]),
        "lossless.webp": _encoded("WEBP", rgb.convert("RGBA"), lossless=True),
        "rgba.bmp": _encoded("BMP", rgb.convert("RGBA")),
        "mpo.mpo": _encoded("MPO", rgb, save_all=True, append_images=[other]),
        "motion-photo.jpg": _encoded("JPEG", rgb) + b"ftypmp42" + bytes(range(256)) * 40,  # a video after the image
        "pgm.pgm": _encoded("PPM", rgb.convert("L")),
    }


@pytest.mark.parametrize("name", sorted(_valid_files()))
def test_valid_files_of_every_kind_pass_and_load(tmp_path: Path, name: str):
    path = tmp_path / name
    path.write_bytes(_valid_files()[name])
    with Image.open(path) as im:
        size = im.size
    for mode in ("header", "full"):
        assert check_image(ImageEntry(1, path, *size), CheckRules(mode, min_size=96, max_size=96)) == AS_STORED
    image, frame = read_image(path)
    assert frame == AS_STORED and image.dtype == torch.float32 and tuple(image.shape) == (3, size[1], size[0])
    assert 0 <= float(image.min()) <= float(image.max()) <= 1
