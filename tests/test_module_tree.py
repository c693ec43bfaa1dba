"""Questions about the module tree (plangen.model.module_tree): key matching, patterns, layers, ties."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch import nn

from plangen.model.module_tree import (
    ModuleIndex,
    find_matching_modules,
    find_transformer_layers,
    find_unmatched_keys,
    generalize,
    key_matches,
    tied_embeddings,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(Block() for _ in range(12))
        self.norm = nn.LayerNorm(4)


class Tiny(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.model = Inner()
        self.lm_head = nn.Linear(4, 10, bias=False)
        if tie:
            self.lm_head.weight = self.model.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


# --- key matching ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, path, expected",
    [
        ("model.layers.*.attn", "model.layers.3.attn", True),
        ("model.layers.*.attn", "model.layers.3.attn.weight", False),  # one segment per atom
        ("model.layers.*", "model.layers.3.attn", False),
        ("model.*.3.attn", "model.layers.3.attn", True),
        ("model.layers.1?.attn", "model.layers.11.attn", True),
        ("model.layers.1?.attn", "model.layers.1.attn", False),
        ("model.layers.[02].attn", "model.layers.2.attn", True),
        ("model.layers.*.Attn", "model.layers.3.attn", False),  # case-sensitive, as on Linux
        ("model.layers.*.mlp.0", "model.layers.7.mlp.0", True),
    ],
)
def test_key_matches_one_fnmatch_per_dotted_segment(pattern, path, expected):
    assert key_matches(pattern, path) is expected


@pytest.mark.parametrize(
    "pattern",
    ["model.layers.*.attn", "model.layers.1?.mlp.*", "*.*", "model.*", "lm_head", "model.layers.*.mlp.[01]", "none"],
)
def test_the_index_selects_what_key_matches_selects_in_module_order(pattern):
    model = Tiny()
    brute = [name for name, _ in model.named_modules() if name and key_matches(pattern, name)]
    index = ModuleIndex(model)
    assert index.paths(pattern) == brute == find_matching_modules(model, pattern)
    assert index.matching(pattern) == [model.get_submodule(name) for name in brute]
    assert index.selects_any(pattern) is bool(brute)


def test_unmatched_keys_are_the_ones_selecting_nothing_in_their_order():
    keys = ["model.layers.*.attn", "model.layers.*.self_attn", "lm_head", "model.layers.99.attn", "model.layers.3.attn"]
    assert find_unmatched_keys(Tiny(), keys) == ["model.layers.*.self_attn", "model.layers.99.attn"]


# --- generalize --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, expected",
    [
        ("model.layers.3.mlp", "model.layers.*.mlp"),
        ("model.layers.31", "model.layers.*"),
        ("model.layers.3.mlp.experts.17.w1", "model.layers.*.mlp.experts.*.w1"),
        ("model.layers.0.1", "model.layers.*.*"),  # an index right after an index
        ("0.weight", "*.weight"),  # a Sequential at the root
        ("model.w1.v2", "model.w1.v2"),  # digits inside a name stay
        ("lm_head", "lm_head"),
        ("", ""),
    ],
)
def test_generalize_turns_every_index_segment_into_a_star(path, expected):
    assert generalize(path) == expected


def test_generalize_agrees_with_transformers_wildcards_on_the_paths_models_have():
    from plangen.stack.transformers_compat import hf_parallel_utils

    replace_layer_number_by_wildcard = hf_parallel_utils().replace_layer_number_by_wildcard

    names = [name for name, _ in Tiny().named_modules()] + [name for name, _ in Tiny().named_parameters()]
    names += ["model.language_model.layers.5.self_attn.q_proj", "model.layers.2.mlp.experts.7.down_proj"]
    for name in names:
        assert generalize(name) == replace_layer_number_by_wildcard(name), name
    # Where they part: transformers' regex needs a dot before each index and consumes the next one.
    assert replace_layer_number_by_wildcard("blocks.0.1") == "blocks.*.1"
    assert replace_layer_number_by_wildcard("0.weight") == "0.weight"


def test_a_generalized_path_is_a_key_selecting_every_repeat():
    model = Tiny()
    assert len(find_matching_modules(model, generalize("model.layers.4.attn"))) == 12
    assert len(find_matching_modules(model, generalize("model.layers.4.mlp.1"))) == 24  # every index


# --- layers and ties ---------------------------------------------------------------------------


def test_transformer_layers_are_the_outermost_declared_blocks():
    model = Tiny()
    assert find_transformer_layers(model) == list(model.model.layers)


def test_without_a_declaration_the_layers_are_the_children_of_module_lists():
    model = nn.Module()
    model.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    model.head = nn.Linear(2, 2)
    assert find_transformer_layers(model) == list(model.blocks)


def test_tied_embeddings_are_named_by_module_path():
    assert tied_embeddings(Tiny(tie=True)) == ("model.embed", "lm_head")
    assert tied_embeddings(Tiny(tie=False)) is None
    assert tied_embeddings(nn.Linear(2, 2)) is None  # no embedding getters at all


def test_importing_it_does_not_import_torch():
    code = "import sys, plangen.model.module_tree; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
