"""What makes a host wait for the device in a training step, counted on any device (a CPU included).

On a GPU the host runs ahead of the device, queueing kernels, until something needs a value or a
shape that only the device knows. `HostWaits` counts, by name, every such call in a block of code:
- reads of a tensor into Python (`item`, `tolist`, `bool(t)`, `float(t)`, `int(t)`, ...), seen as
  torch functions;
- operators whose output shape depends on the data (`nonzero`, `masked_select`, boolean-mask indexing,
  `unique`, torchvision's `nms`, `repeat_interleave` without `output_size`) and the scalar reads under
  all of them (`_local_scalar_dense`), seen as aten operators.
A read counts twice (`item` and the `_local_scalar_dense` it runs), as the tests and the figures of
docs/performance.md count it. On a GPU, torch.cuda.set_sync_debug_mode and the profiler count the
synchronisations themselves (benchmarks/bench_gpu_step.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy"})
DATA_DEPENDENT = frozenset(
    {"nonzero", "masked_select", "nms", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive"}
    | {"_local_scalar_dense", "bincount"}
)
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})


class _Reads(TorchFunctionMode):
    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in READS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


class _Operators(TorchDispatchMode):
    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in DATA_DEPENDENT:
            self.counts[name] += 1
        elif name in INDEXING and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self.counts[f"{name}[bool]"] += 1
        elif name == "repeat_interleave" and kwargs.get("output_size") is None and not _sized(args):
            self.counts[name] += 1
        return func(*args, **kwargs)


def _sized(args: tuple) -> bool:
    """repeat_interleave.Tensor(repeats, *, output_size) / .self_Tensor(self, repeats, dim, *, output_size)."""
    return len(args) > 3 and args[3] is not None


class HostWaits:
    """`with HostWaits() as waits: ...` then `waits.counts` (name -> calls) and `waits.total`."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self._modes = (_Reads(self.counts), _Operators(self.counts))

    def __enter__(self) -> HostWaits:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.counts.values())
