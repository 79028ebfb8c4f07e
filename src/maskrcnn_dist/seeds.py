"""The run's draws as functions of where they happen: a hash of --seed and the place (an epoch's image
and what is drawn for it, a step's micro-batch and module, an image id), never a generator's state, so a
resumed run, any number of loader workers, every rank and every engine draw the same. Torch-free."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")

SEED_BITS = 63  # torch.manual_seed takes a signed 64-bit integer


def _digest(seed: int, parts: tuple[object, ...]) -> bytes:
    return hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()


def _as_seed(digest: bytes) -> int:
    """A torch seed from a digest's first 8 bytes."""
    return int.from_bytes(digest[:8], "little") & ((1 << SEED_BITS) - 1)


def draw_seed(seed: int, *parts: object) -> int:
    """The seed of the draws at `parts` (printed with str: 3 and "3" are one place) in a run of `seed`."""
    return _as_seed(_digest(seed, parts))


def model_draw_seed(*parts: object) -> int:
    """The seed of the model's own draws at `parts` (modeling/rng.py: seed, step, micro-batch, module).
    Its hash (blake2b of the parts' repr) predates draw_seed's and stays: moving it would change every
    run's sampled anchors and proposals, a resumed checkpoint's included."""
    return _as_seed(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest())


def draw_order(seed: int, items: Iterable[T]) -> list[T]:
    """`items` shuffled by `seed`: each put at the place its own draw gives it, so that an item keeps its
    rank among any others of the same seed."""
    return sorted(items, key=lambda item: _digest(seed, (item,)))
