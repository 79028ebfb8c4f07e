"""The image files: the data check (check.py) and its cached verdicts (check_cache.py), what a file is
vouched for by (image_file.py), the frame it is read in (orientation.py) and the size the model's resize
gives it (resize.py). Invariant: the check and the loader decide a frame by one function."""
