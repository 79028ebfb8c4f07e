"""An image record's file name: its `file_name`, else the path of its URL.

LVIS v1 lists its images by `coco_url` alone (`http://images.cocodataset.org/train2017/000000391895.jpg`:
its files are COCO 2017's, its val split's drawn from COCO's train2017 too), and other exports list only
a URL field. detectron2 joins the URL's last two parts to its COCO folder, MMDetection strips the host;
here the URL's path is the file name (`train2017/000000391895.jpg`) and the file_name rule
(data/sources/file_names.py) drops its leading folders until the file is found under the split's image
folder: the folder holding train2017/ and val2017/, or train2017/ itself, or any folder the images were
downloaded into flat. A `file_name` that is itself a URL (`https://bucket.example/x.jpg?X-Amz-Signature=...`,
as some converters write cloud-hosted images) is taken by its path the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

# The fields an image's location is taken from when it has no file_name, in this order (COCO and LVIS
# write coco_url; `url` and `image_url` are other tools'). flickr_url is left out: its file name is
# Flickr's, never the name a downloaded set has.
URL_FIELDS = ("coco_url", "url", "image_url")


def url_path(url: str) -> str:
    """The path a URL names, without its host, query or fragment, percent-escapes decoded; a value
    that is no URL (a plain path) as it is."""
    parts = urlsplit(url.strip())
    if not (parts.scheme and parts.netloc):
        return url.strip()
    return unquote(parts.path).lstrip("/")


def image_file_name(record: Mapping[str, Any]) -> str:
    """The image's file name: a non-empty `file_name` (the path of a URL written there: a signed
    URL's query is no part of the file's name), else the path of its first URL field, else ""."""
    name = record.get("file_name")
    if isinstance(name, str) and name:
        return url_path(name) or name if "://" in name else name
    for field in URL_FIELDS:
        url = record.get(field)
        if isinstance(url, str) and (path := url_path(url)):
            return path
    return ""
