"""Where every form of the loop takes its steps' batches: one source, under the engine's device prefetch.

`GlobalBatches.at(position)` is this process's share of the global batch at `position` (data/plan.py: rank
`r` of `n`'s share of global batch `b` of epoch `e`, `r` and `n` the engine's at the call), its
micro-batches loaded and on their way to the engine's device (`Engine.on_device`: the next batch's copy
overlaps the current step on a GPU). The epoch's loader is kept while the steps go in order and made again
at the asked batch after anything else: a new epoch, a change of rank or world size (an elastic group's new
generation), a step redone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ..data.loader import StepBatch
from ..engines.base import Engine
from .state import Position

#: The steps of one epoch from a global batch on: (epoch, start_batch) -> this process's share of each
#: global batch (data/plan.py), its micro-batches loaded.
LoaderFactory = Callable[[int, int], Iterable[StepBatch]]


class GlobalBatches:
    """This process's share of each global batch, read through `loader` (data/prepare.py's train_loaders,
    which reads the engine's rank and world size at each call) and prefetched by `engine`."""

    def __init__(self, loader: LoaderFactory, engine: Engine) -> None:
        self.loader, self.engine = loader, engine
        self._at: tuple[int, int, int, int] | None = None  # (epoch, next batch, rank, size) of the iterator
        self._steps: Iterator[StepBatch] = iter(())

    def at(self, position: Position) -> StepBatch:
        epoch, batch, engine = position.epoch, position.batch, self.engine
        where = (epoch, batch, engine.data_rank, engine.data_world_size)
        if self._at != where:
            self.reset()  # the old loader's workers end before the new one's start
            self._steps = iter(engine.on_device(self.loader(epoch, batch)))
        step = next(self._steps, None)
        if step is None:
            raise RuntimeError(f"the loader of epoch {epoch} ended before its global batch {batch}")
        self._at = (epoch, batch + 1, *where[2:])
        return step

    def reset(self) -> None:
        """Forget the loader: the next call makes it again (after a change of generation)."""
        self._at, self._steps = None, iter(())
