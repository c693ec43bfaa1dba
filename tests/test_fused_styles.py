"""Fused projections re-laid out for TP (plangen.styles.fused), on a single-process fake TP=2 mesh.

What each rank holds, what it computes, and the state-dict translation that needs no collective
(loading a plain Hugging Face tensor); the gathered round trip at DP 2 × TP 2 runs in
tests/test_parallelize_distributed.py (``phi3-state-dict``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from plangen.styles.fused import (
    FusedColwiseParallel,
    LocalHeadCounts,
    MultiQueryColwiseParallel,
    hugging_face_layout,
    interleave_index,
)
from plangen.model.module_facts import ConfigView


@pytest.fixture(scope="module")
def tp_mesh(fake_pg):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", [0, 1])  # two ranks of the session's fake group


def _apply(module: nn.Module, style, mesh) -> nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    holder = nn.Module()
    holder.m = module
    parallelize_module(holder, mesh, {"m": style})
    return holder


# q has 8 rows (2 parts of 4), k and v 4 each, as GQA with twice as many query heads.
RANK0 = [0, 1, 2, 3, 8, 9, 12, 13]
RANK1 = [4, 5, 6, 7, 10, 11, 14, 15]


def test_interleave_index_puts_each_ranks_slice_of_every_part_together():
    assert interleave_index(16, (2, 1, 1), 2).tolist() == RANK0 + RANK1
    assert interleave_index(8, (1, 1), 2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    with pytest.raises(ValueError, match="must each split evenly"):
        interleave_index(12, (2, 1, 1), 2)  # k and v of 3 rows each
    with pytest.raises(ValueError, match="proportions"):
        interleave_index(10, (2, 1, 1), 2)


def test_fused_colwise_gives_each_rank_its_own_parts_without_communication(tp_mesh):
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    linear = nn.Linear(8, 16)
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()
    m = _apply(linear, FusedColwiseParallel(part_sizes=(2, 1, 1)), tp_mesh).m
    assert isinstance(m.weight, DTensor) and tuple(m.weight.placements) == (Shard(0),)  # FSDP2 composes with it
    assert torch.equal(m.weight.to_local(), weight[RANK0]) and torch.equal(m.bias.to_local(), bias[RANK0])
    x = torch.randn(2, 5, 8)
    with CommDebugMode() as comm:
        out = m(x)
    assert type(out) is torch.Tensor and comm.get_total_counts() == 0
    torch.testing.assert_close(out, (x @ weight.T + bias)[..., RANK0])


def test_fused_colwise_loads_a_hugging_face_tensor_into_this_ranks_rows(tp_mesh):
    holder = _apply(nn.Linear(8, 16), FusedColwiseParallel(part_sizes=(2, 1, 1)), tp_mesh)
    new_weight, new_bias = torch.randn(16, 8), torch.randn(16)
    holder.load_state_dict({"m.weight": new_weight, "m.bias": new_bias})
    assert torch.equal(holder.m.weight.to_local(), new_weight[RANK0])
    assert torch.equal(holder.m.bias.to_local(), new_bias[RANK0])
    # The gathered (TP-ordered) weight is put back in Hugging Face's order by name.
    gathered = torch.cat([new_weight[RANK0], new_weight[RANK1]])
    assert torch.equal(hugging_face_layout(holder, "m.weight", gathered), new_weight)
    assert torch.equal(hugging_face_layout(holder, "m.bias", torch.cat([new_bias[RANK0], new_bias[RANK1]])), new_bias)


def test_fused_colwise_refuses_modules_it_cannot_split(tp_mesh):
    with pytest.raises(ValueError, match="must each split evenly"):
        _apply(nn.Linear(8, 12), FusedColwiseParallel(part_sizes=(2, 1, 1)), tp_mesh)
    with pytest.raises(NotImplementedError, match="nn.Linear and Conv1D only"):
        _apply(nn.Embedding(8, 8), FusedColwiseParallel(), tp_mesh)


def test_multi_query_colwise_stores_its_share_and_computes_its_query_heads_with_the_whole_kv_head(tp_mesh):
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    # Multi-query [q; k; v]: 4 query heads of 2 and one k and one v head: parts of 8, 2 and 2 rows.
    linear = nn.Linear(8, 12)
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()
    m = _apply(linear, MultiQueryColwiseParallel(part_sizes=(4, 1, 1), shared_parts=(1, 2)), tp_mesh).m
    # Stored as any column-parallel weight: this rank's query rows and half of the k and of the v rows.
    assert isinstance(m.weight, DTensor) and tuple(m.weight.placements) == (Shard(0),)
    assert torch.equal(m.weight.to_local(), weight[[0, 1, 2, 3, 8, 10]])
    x = torch.randn(2, 5, 8, requires_grad=True)
    with CommDebugMode() as comm:
        out = m(x)
    # This rank's 2 query heads and the whole k and v head; the shared rows gathered once per parameter.
    assert type(out) is torch.Tensor and out.shape == (2, 5, 4 + 2 + 2)
    assert comm.get_comm_counts() == {torch.ops.c10d_functional.all_gather_into_tensor: 2}
    torch.testing.assert_close(out[..., :4], x @ weight[:4].T + bias[:4])
    assert isinstance(m.weight, DTensor) and isinstance(m.bias, DTensor)  # the parameters are back
    with CommDebugMode() as comm:
        out.sum().backward()
    # The shared rows' gradient reduce-scattered, the input's all-reduced (as column-parallel's).
    assert {str(op).split(".")[-1] for op in comm.get_comm_counts()} == {"reduce_scatter_tensor", "all_reduce"}
    assert m.weight.grad.to_local().shape == (6, 8)


def test_multi_query_colwise_keeps_the_hugging_face_state_dict(tp_mesh):
    holder = _apply(nn.Linear(8, 12), MultiQueryColwiseParallel(part_sizes=(4, 1, 1)), tp_mesh)
    new_weight = torch.randn(12, 8)
    holder.load_state_dict({"m.weight": new_weight, "m.bias": torch.randn(12)})
    assert torch.equal(holder.m.weight.to_local(), new_weight[[0, 1, 2, 3, 8, 10]])
    gathered = torch.cat([new_weight[[0, 1, 2, 3, 8, 10]], new_weight[[4, 5, 6, 7, 9, 11]]])
    assert torch.equal(hugging_face_layout(holder, "m.weight", gathered), new_weight)
    with pytest.raises(ValueError, match="shared_parts"):
        MultiQueryColwiseParallel(part_sizes=(4, 1, 1), shared_parts=(3,))


class _Attention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.num_key_value_heads = config.num_key_value_heads


def test_local_head_counts_divide_the_modules_counts_and_leave_the_models_config(tp_mesh):
    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, _attn_implementation="sdpa")
    attention = _Attention(config)
    style = LocalHeadCounts(attributes=("num_key_value_heads", "config.num_attention_heads"))
    _apply(attention, style, tp_mesh)
    assert attention.num_key_value_heads == 1 and attention.config.num_attention_heads == 2
    assert isinstance(attention.config, ConfigView) and config.num_attention_heads == 4
    config._attn_implementation = "eager"  # a later change to the model's config shows through
    assert attention.config._attn_implementation == "eager" and attention.config.num_key_value_heads == 2


def test_local_head_counts_refuse_a_count_that_does_not_divide(tp_mesh):
    attention = _Attention(SimpleNamespace(num_attention_heads=3, num_key_value_heads=3))
    with pytest.raises(ValueError, match="num_attention_heads=3 does not divide by the TP size 2"):
        _apply(attention, LocalHeadCounts(attributes=("config.num_attention_heads",)), tp_mesh)


def test_conv1d_styles_split_the_transposed_weight(tp_mesh):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from transformers.pytorch_utils import Conv1D

    from plangen.styles.fused import Conv1DColwiseParallel, Conv1DRowwiseParallel

    # Fused c_attn [in, out] = [8, 16]: q, k, v in proportion 2 : 1 : 1 along dim 1, bias along dim 0.
    fused = Conv1D(16, 8)
    weight, bias = fused.weight.detach().clone(), fused.bias.detach().clone()
    m = _apply(fused, FusedColwiseParallel(part_sizes=(2, 1, 1)), tp_mesh).m
    assert tuple(m.weight.placements) == (Shard(1),) and torch.equal(m.weight.to_local(), weight[:, RANK0])
    x = torch.randn(2, 5, 8)
    with CommDebugMode() as comm:
        out = m(x)
    assert comm.get_total_counts() == 0
    torch.testing.assert_close(out, (x @ weight + bias)[..., RANK0])

    column = _apply(Conv1D(16, 8), Conv1DColwiseParallel(), tp_mesh).m
    assert tuple(column.weight.placements) == (Shard(1),) and column.weight.to_local().shape == (8, 8)
    assert column(x).shape == (2, 5, 8)

    row = _apply(Conv1D(8, 16), Conv1DRowwiseParallel(), tp_mesh).m  # [in 16, out 8]
    assert tuple(row.weight.placements) == (Shard(0),) and row.weight.to_local().shape == (8, 8)
    assert tuple(row.bias.placements) == (Replicate(),)  # added once, after the sum
    with CommDebugMode() as comm:
        out = row(torch.randn(2, 5, 8)) * 1  # this rank's half of the 16 input features
    assert out.shape == (2, 5, 8) and comm.get_comm_counts() and comm.get_total_counts() == 1


def test_padded_layout_keeps_a_real_head_on_every_rank():
    # Falcon-7B's 71 query heads (plangen.model.pad_layout): 72 at TP 2, 4 and 8, one zero head on the last rank.
    from plangen.model.pad_layout import (
        largest_padded_tp_size,
        legal_padded_tp_size,
        local_pad_features,
        padded_head_count,
        padded_tp_problem,
        real_rows,
    )

    assert [padded_head_count(71, tp) for tp in (1, 2, 4, 8)] == [71, 72, 72, 72]
    assert all(legal_padded_tp_size(71, tp) for tp in (1, 2, 4, 8, 36, 71))
    assert not legal_padded_tp_size(71, 70) and not legal_padded_tp_size(71, 128)  # ranks of pad only
    assert largest_padded_tp_size(71) == 71 and largest_padded_tp_size(71, 70) == 36
    problem = padded_tp_problem(71, 128, "FalconForCausalLM")
    assert "\n" not in problem and problem.endswith("the largest legal TP size for FalconForCausalLM is 71")
    # 5 heads of 2 at TP 2: rank 0 holds heads 0-2, rank 1 heads 3-5 of which 5 is pad (its local features 4:6).
    assert [local_pad_features(5, 2, r, 2) for r in (0, 1)] == [None, (4, 6)]
    assert real_rows(5, 6, 2, 4) == [*range(10), *range(12, 16)]


def test_falcon_tp_sizes_are_checked_against_the_padded_layout():
    from plangen.model.heads import any_layout_tp_size_problem, tp_size_problem
    from plangen.model.resolve import resolve_model

    config = resolve_model("falcon").config
    for tp in (2, 4, 8):
        assert tp_size_problem(config, tp, "FalconForCausalLM", padded_heads=True) is None
        assert any_layout_tp_size_problem(config, tp, "FalconForCausalLM") is None
        assert tp_size_problem(config, tp, "FalconForCausalLM") is not None  # unpadded: 71 splits over none
    assert "largest legal TP size for FalconForCausalLM is 71" in any_layout_tp_size_problem(
        config, 128, "FalconForCausalLM"
    )


def test_fused_state_dict_entry_is_this_ranks_rows_at_hugging_face_offsets_without_a_gather(tp_mesh):
    """state_dict() of a re-laid-out weight gathers nothing (issue 29): a DTensor of Hugging Face's shape
    over this rank's rows (the parameter's storage), whose checkpoint chunks are its runs of Hugging Face
    rows; a cast or a clone keeps that layout, other ops are refused."""
    from torch.distributed.tensor.debug import CommDebugMode

    from plangen.styles.hf_layout import HuggingFaceLayoutTensor

    linear = nn.Linear(8, 16)
    weight = linear.weight.detach().clone()
    holder = _apply(linear, FusedColwiseParallel(part_sizes=(2, 1, 1)), tp_mesh)
    with CommDebugMode() as comm:
        entry = holder.state_dict()["m.weight"]
    assert comm.get_total_counts() == 0
    assert isinstance(entry, HuggingFaceLayoutTensor) and tuple(entry.shape) == (16, 8)
    assert entry._local_tensor.untyped_storage().data_ptr() == holder.m.weight.to_local().untyped_storage().data_ptr()
    chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in entry.__create_chunk_list__()]
    assert chunks == [((0, 0), (4, 8)), ((8, 0), (2, 8)), ((12, 0), (2, 8))]  # RANK0's runs of q, k, v
    for chunk in entry.__create_chunk_list__():
        rows = slice(chunk.offsets[0], chunk.offsets[0] + chunk.sizes[0])
        index = type("Index", (), {"offset": chunk.offsets, "fqn": "m.weight", "index": None})()
        assert torch.equal(entry.__get_tensor_shard__(index), weight[rows])
    half = entry.to(torch.float16)
    assert isinstance(half, HuggingFaceLayoutTensor) and half.dtype == torch.float16 and tuple(half.shape) == (16, 8)
    assert torch.equal(half._local_tensor, weight[RANK0].half())
    with pytest.raises(TypeError, match="full_tensor"):
        entry.sum()


def test_optimizer_state_entry_is_the_live_state_in_hugging_face_layout(tp_mesh):
    """plangen.runtime.state_dict: a re-laid-out parameter's per-element optimizer state is shown like its weight
    (a view of the live state at Hugging Face's offsets, the optimizer's own dicts untouched) and goes
    back as the state's own storage; a state of another shape cannot follow the rows and is refused."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.tensor import DTensor

    from plangen.styles.hf_layout import HuggingFaceLayoutTensor
    from plangen.runtime.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    holder = _apply(nn.Linear(8, 16), FusedColwiseParallel(part_sizes=(2, 1, 1)), tp_mesh)
    optimizer = torch.optim.SGD(holder.parameters(), lr=0.1, momentum=0.9)
    holder.m(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    live = optimizer.state[holder.m.weight]["momentum_buffer"]
    state = get_optimizer_state_dict(holder, optimizer)
    entry = state["state"]["m.weight"]["momentum_buffer"]
    assert isinstance(entry, HuggingFaceLayoutTensor) and tuple(entry.shape) == (16, 8)
    assert entry._local_tensor.data_ptr() == live.to_local().data_ptr()
    assert [(tuple(c.offsets), tuple(c.sizes)) for c in entry.__create_chunk_list__()] == [
        ((0, 0), (4, 8)),
        ((8, 0), (2, 8)),
        ((12, 0), (2, 8)),
    ]  # RANK0's runs, as the weight's
    assert type(optimizer.state[holder.m.weight]["momentum_buffer"]) is DTensor  # the optimizer's own, unwrapped
    flat = get_optimizer_state_dict(holder, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
    assert isinstance(flat["state.m.weight.momentum_buffer"], HuggingFaceLayoutTensor)

    set_optimizer_state_dict(holder, optimizer, state)
    assert optimizer.state[holder.m.weight]["momentum_buffer"].to_local().data_ptr() == live.to_local().data_ptr()

    class RowFactor(torch.optim.SGD):  # keeps a per-row statistic, as Adafactor does
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["row_factor"] = torch.zeros_like(p).sum(dim=-1)

    factored = RowFactor(holder.parameters(), lr=0.1)
    factored.step()
    with pytest.raises(NotImplementedError, match=r"^m\.weight: the optimizer's state 'row_factor' has shape \(16,\)"):
        get_optimizer_state_dict(holder, factored)


def test_padded_multi_query_heads_make_the_kv_group_size_this_ranks_too(fake_pg):
    """One KV head: the group size the attention repeats it by (transformers 5.25's Falcon reads
    ``num_key_value_groups`` in ``repeat_kv``) is the query count, so it becomes this rank's padded
    share with the heads (5 heads padded to 6 at TP 2: 3 a rank); left as it was, the repeated KV
    would have 5 heads against the rank's 3 queries."""

    from plangen.distributed.fake_group import tp_mesh
    from plangen.styles.padded_heads import apply_padded_heads

    attention = nn.Module()
    attention.config = SimpleNamespace(num_attention_heads=5)
    attention.head_dim, attention.num_heads, attention.num_key_value_groups = 8, 5, 5
    attention.query_key_value = nn.Linear(40, (5 + 2) * 8)
    attention.dense = nn.Linear(40, 40)
    apply_padded_heads(attention, tp_mesh(2), ("num_heads",))
    assert (attention.num_heads, attention.num_key_value_groups) == (3, 3)
