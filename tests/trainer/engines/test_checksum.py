"""engines.base.checksum, the one weight digest (pipeline replicas, elastic members): equal exactly where
the tensors are bitwise equal, their dtypes and shapes included."""

from __future__ import annotations

import torch

from maskrcnn_dist.engines.base import checksum
from maskrcnn_dist.engines.pipeline.state import checksum as replicas_checksum


def test_equal_bytes_dtypes_and_shapes_give_one_digest_and_any_difference_another() -> None:
    weights = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([float("nan")]), torch.empty(0)]
    assert checksum(weights) == checksum([w.clone() for w in weights])
    assert checksum(w for w in weights) == checksum(weights)  # any iterable: parameters() is a generator
    one_bit = weights[0].clone()
    one_bit.view(torch.int32)[0, 0] ^= 1
    other_nan = torch.tensor([1], dtype=torch.int32).view(torch.float32) * 0 + weights[1]
    other_nan.view(torch.int32)[0] ^= 1  # another NaN payload: still NaN, other bytes
    variants = [
        [one_bit, *weights[1:]],
        [weights[0], other_nan, weights[2]],
        [weights[0].reshape(3, 2), *weights[1:]],  # the same bytes, another shape
        [weights[0].view(torch.int32), *weights[1:]],  # the same bytes, another dtype
        weights[:2],  # an empty tensor less
    ]
    digests = {checksum(weights), *(checksum(v) for v in variants)}
    assert len(digests) == 1 + len(variants)


def test_the_pipeline_s_replica_checksum_is_this_one() -> None:
    assert replicas_checksum is checksum
