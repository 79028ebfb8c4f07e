"""seeds.py, the one hash behind the run's draws: each place that hashed its own before draws exactly
what it drew (the old hashes are written out here as the reference), so no run, resumed checkpoint or
carved val split changes."""

from __future__ import annotations

import hashlib
import itertools

from maskrcnn_dist.data import flip_decision
from maskrcnn_dist.seeds import SEED_BITS, draw_order, draw_seed, model_draw_seed

SEEDS = (0, 7, 2**31 + 5, 2**62 + 11)
PLACES = list(itertools.product(SEEDS, range(4), range(300)))  # (seed, epoch, image index)


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def test_the_augmentations_draw_the_seeds_they_drew() -> None:
    """transforms/augment.py's own draw_seed: the first 8 bytes of sha256("seed:epoch:index:what")."""
    for (seed, epoch, index), what in itertools.product(PLACES, ("augment", "paste")):
        old = int.from_bytes(_sha256(f"{seed}:{epoch}:{index}:{what}")[:8], "little") & (2**63 - 1)
        assert draw_seed(seed, epoch, index, what) == old


def test_the_flips_are_the_flips_they_were() -> None:
    """transforms/flip.py: flipped where the first byte of sha256("seed:epoch:index") is under 128."""
    decisions = [flip_decision(*place) for place in PLACES]
    assert decisions == [_sha256(f"{s}:{e}:{i}")[0] < 128 for s, e, i in PLACES]
    assert 0.4 < sum(decisions) / len(decisions) < 0.6  # a fair coin, not a constant


def test_a_carved_val_split_orders_the_images_as_it_did() -> None:
    """sources/resolve.py's carve_val: the image ids sorted by sha256("seed:id")."""
    ids = [1, 5, 42, 9, 1000, 77, 3, 123456, 8] + list(range(2000, 2300))
    for seed in SEEDS:
        assert draw_order(seed, ids) == sorted(ids, key=lambda iid: _sha256(f"{seed}:{iid}"))
    assert draw_order(0, ids) != draw_order(1, ids)
    assert draw_order(0, ids[:50]) == [i for i in draw_order(0, ids) if i in set(ids[:50])]  # each keeps its rank


def test_a_seed_is_a_63_bit_torch_seed_that_depends_on_every_part() -> None:
    drawn = {draw_seed(*place) for place in PLACES}
    assert len(drawn) == len(PLACES) and all(0 <= d < 2**SEED_BITS for d in drawn)
    assert draw_seed(7, 1, 2) != draw_seed(7, 2, 1) != draw_seed(7, 1, 2, "paste")


def test_the_models_draws_keep_their_seeds() -> None:
    """modeling/rng.py's seeds, pinned: moving them (to draw_seed's hash, say) would change every run's
    sampled anchors and proposals, and a resumed checkpoint's would no longer follow its run."""
    assert model_draw_seed(7, 3, 1, "rpn") == 8036885559912809686
    assert model_draw_seed(7, 3, 1, "rpn") != model_draw_seed(7, 3, 1, "roi_heads")
