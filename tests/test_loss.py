"""vocab_parallel_cross_entropy equals F.cross_entropy, value and gradient.

On a one-rank mesh every collective is the identity, so the DTensor path (offsets, masking of
targets outside the shard, the hand-written backward) is compared exactly with torch's own loss;
the multi-rank path is covered by the parity tests, whose loss goes through it at TP=2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from plangen.loss import vocab_parallel_cross_entropy


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch_cross_entropy_with_ignored_targets(fake_pg, reduction):
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(0, 11, (2, 5))
    target[0, :2] = -100
    expected = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=-100, reduction=reduction)
    (expected.sum()).backward()
    expected_grad = logits.grad.clone()

    logits.grad = None
    mesh = DeviceMesh("cpu", torch.arange(1))
    sharded = DTensor.from_local(logits, mesh, (Shard(-1),), run_check=False)
    got = vocab_parallel_cross_entropy(sharded, target, reduction=reduction)
    got.sum().backward()
    assert torch.allclose(got.reshape(expected.shape), expected, atol=1e-6)
    assert torch.allclose(logits.grad, expected_grad, atol=1e-6)


def test_logits_not_sharded_on_the_vocabulary_are_refused(fake_pg):
    mesh = DeviceMesh("cpu", torch.arange(1))
    logits = DTensor.from_local(torch.randn(2, 3, 7), mesh, (Shard(1),), run_check=False)
    with pytest.raises(ValueError, match="expected logits sharded on the vocabulary only"):
        vocab_parallel_cross_entropy(logits, torch.zeros(2, 3, dtype=torch.long))
    replicated = DTensor.from_local(torch.randn(2, 3, 7), mesh, (Replicate(),), run_check=False)
    with pytest.raises(ValueError, match="vocabulary"):
        vocab_parallel_cross_entropy(replicated, torch.zeros(2, 3, dtype=torch.long))
