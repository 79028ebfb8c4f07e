"""The batched sampler takes, per image, exactly as many positives and negatives as torchvision's
BalancedPositiveNegativeSampler for any labels (property test over random shapes, with no candidates,
all positive, all negative, all ignored), never one it may not take, and draws uniformly (chi-square)."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.models.detection._utils import BalancedPositiveNegativeSampler

from maskrcnn_dist.modeling.batched.sampler import sample


def labels_like(g: torch.Generator, batch: int, n: int, mix: str) -> torch.Tensor:
    """(batch, n) labels: -1 ignored, 0 negative, >= 1 a class, per `mix`."""
    if mix == "random":
        labels = torch.randint(-1, 4, (batch, n), generator=g)
        # each image its own mix: few positives in some, few negatives in others
        bias = torch.randint(0, 3, (batch, 1), generator=g)
        return torch.where(torch.rand(batch, n, generator=g) < 0.3 * bias, 0, labels)
    fill = {"positive": 2, "negative": 0, "ignored": -1}[mix]
    return torch.full((batch, n), fill)


@pytest.mark.parametrize("mix", ["random", "positive", "negative", "ignored"])
@pytest.mark.parametrize("seed", range(25))
def test_counts_per_image_are_torchvisions(mix: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 5, (), generator=g))
    n = int(torch.randint(0, 400, (), generator=g)) if seed % 5 else 0  # none at all, too
    per_image = int(torch.randint(1, 300, (), generator=g))
    fraction = float(torch.rand((), generator=g))
    labels = labels_like(g, batch, n, mix)
    positive, negative = sample(labels, per_image, fraction)
    reference = BalancedPositiveNegativeSampler(per_image, fraction)
    expected_pos, expected_neg = reference(list(labels))
    assert positive.sum(1).tolist() == [int(m.sum()) for m in expected_pos]
    assert negative.sum(1).tolist() == [int(m.sum()) for m in expected_neg]
    assert not (positive & (labels < 1)).any() and not (negative & (labels != 0)).any()


def test_the_draw_is_uniform() -> None:
    """600 draws of 6 negatives among 40 and 2 positives among 12: every candidate is taken about
    equally often. Each chi-square statistic is compared with its 1 - 1e-6 quantile (Wilson-Hilferty
    approximation): a uniform draw fails the test for at most 2 in a million seeds (two statistics); the
    seed is fixed, so the test is repeatable. A draw that favours later candidates by a fifth of a key's
    range (keys + 0.2 x position / N) fails it; a sampler that sorts instead of shuffling fails it by
    orders of magnitude."""
    torch.manual_seed(1234)
    labels = torch.tensor([[1] * 12 + [0] * 40 + [-1] * 8])
    counts = torch.zeros(labels.shape[1])
    draws = 600
    for _ in range(draws):
        positive, negative = sample(labels, batch_size_per_image=8, positive_fraction=0.25)
        counts += (positive | negative)[0].float()
    assert counts[52:].sum() == 0  # never an ignored one
    for taken, span in ((2, slice(0, 12)), (6, slice(12, 52))):
        observed = counts[span]
        expected = draws * taken / observed.numel()
        statistic = float(((observed - expected) ** 2 / expected).sum())
        assert statistic < chi_square_quantile(observed.numel() - 1, 1e-6), (statistic, observed.tolist())


def chi_square_quantile(dof: int, false_alarm: float) -> float:
    """The (1 - false_alarm) quantile of chi-square with `dof` degrees of freedom (Wilson-Hilferty)."""
    z = normal_quantile(1 - false_alarm)
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def normal_quantile(p: float) -> float:
    low, high = -10.0, 10.0
    for _ in range(100):  # bisection on the normal CDF
        mid = (low + high) / 2
        low, high = (mid, high) if 0.5 * math.erfc(-mid / math.sqrt(2)) < p else (low, mid)
    return (low + high) / 2
