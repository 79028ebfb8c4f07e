"""Reading an annotation file into a SampleStore: rules.py (the records) and mask_rules.py (their
segmentations) state each rule once, json_read.py and fast_read.py only decode, store.py owns the layout
and its per-row views, read.py maps the store from its cache or reads it. Invariant: no torch here (the
command line parses ahead before torch loads).

The seam for a new annotation format: read.DECODERS, the formats a file is read as, in order. A new one
is a read.Decoder (the file's judged columns and categories, or read.Declined) before COCO's json decoder,
which takes any JSON file (tests/trainer/data/test_decoders.py adds one).
"""
