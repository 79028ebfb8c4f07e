"""Reading an annotation file into a SampleStore: rules.py states each rule once, json_read.py and
fast_read.py only decode, store.py owns the layout and its per-row views, read.py maps the store from its
cache or reads it. Invariant: no torch here (the command line parses ahead before torch loads).

A new annotation format is a Decoder (read.py: the file's columns and categories, or Declined) in
DECODERS, before COCO's json decoder, which takes any JSON file.
"""

from .read import DECODERS, Declined, Decoder

__all__ = ["DECODERS", "Declined", "Decoder"]
