"""The model and what computes it: torchvision's Mask R-CNN built from the configuration, and the
numerics every engine shares.

- `model.py`: `build_model` (torchvision's builders, weights, frozen layers) and reading state dicts;
- `batched/`: the RPN and RoI heads' training forward on the whole batch (--heads batched), a few host
  waits a step; `waits.py` counts them; `canvas.py`: fixed canvases and the backbone as CUDA graphs;
- `roi_align.py`: the RoIAlign that replaces torchvision's on CPU (same numbers, faster backward);
- `exact_resize.py`: the model's resize in float64, for exported models;
- `perf.py`: mixed precision, memory format and denormal floats, in one place;
- `fold_bn.py`: frozen BatchNorm folded into the convolution before it, for training steps;
- `compiled.py`: the backbone compiled with torch.compile (--compile), where a compiler exists;
- `rng.py`: per-step seeding of the model's random parts (a resumed or pipelined run draws the same);
- `optim.py`: the optimizer and the learning-rate schedule.

Nothing here knows of engines, the loop or the process's lifetime.
"""
