"""Walk a model and find what a synthesized plan can shard, at concrete module paths.

:func:`analyze_model` finds the vocabulary embedding and the output head, the list of decoder
layers (the one nearest the embedding: multimodal models hold vision blocks too), and per layer
child: per-feature modules on the residual stream (norms), blocks a family can shard
(asked in :mod:`plangen.plans.families.registry`'s order; each block says where it can be placed),
and blocks that stay replicated, with the reason. Everything
with parameters outside the layers that is not the embedding, the head or a norm stays replicated.

It also collects why sequence parallelism would not be safe: every module on the residual stream
must take a sequence-sharded DTensor. Norms do (``SequenceParallel``); replicated blocks of a layer
do when the layer's source says how they are called and what they return (they are then given the
whole sequence, see :class:`KeptPart`); anything else does not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from torch import nn

from plangen.plan import Replicated
from plangen.plans.source.forward import (
    BlockCall,
    read_added_buffer_reads,
    read_added_children,
    read_block_call,
    read_modified_in_place,
    read_returned_parameters,
    read_weight_reads,
    read_weight_row_reads,
)
from plangen.plans.synthesis.block_stacks import analyze_block_stacks, find_block_stacks
from plangen.plans.synthesis.analysis_split import analyze_parent_of_split, analyze_split, split_blocks_by_child
from plangen.plans.synthesis.findings import BlockPart, Findings, KeptPart
from plangen.plans.families.layer_experts import read_experts_norms
from plangen.plans.families.per_head_inputs import PerHeadInput, read_head_input_rows, read_layers_head_input
from plangen.plans.synthesis.per_layer_inputs import PerLayerInputs, find_per_layer_inputs
from plangen.plans.families.core import (
    KeptBlock,
    LayerExpertsBlock,
    ShardedBlock,
    unrecognized,
    recognize_layer_experts,
    recognize_layer_mlp,
)
from plangen.plans.families.dims import (
    ModelDims,
    has_parameters,
    is_linear,
    is_per_feature,
    own_parameters,
    layer_dims,
    read_dims,
)
from plangen.plans.families.split import recognize_attention_called_alike
from plangen.plans.families.packed import WrappedBlock
from plangen.plans.families.registry import recognize_block
from plangen.plans.synthesis.towers import Towers, analyze_towers, tower_kept_reason


@dataclass(frozen=True)
class Analysis:
    """What the synthesizer found in one model, at concrete module paths."""

    class_name: str
    layers_path: str | None
    layer_count: int
    embedding: str | None
    head: str | None
    norms: tuple[str, ...]
    blocks: tuple[BlockPart, ...]
    kept: tuple[Replicated, ...]
    gathered: tuple[KeptPart, ...]  # replicated blocks on the residual stream, wrapped under SP
    sp_problems: tuple[str, ...]
    problem: str | None  # why no plan can be synthesized at all
    # Position embeddings added to the token embedding outside the layers (BART's embed_positions):
    # whole on every rank; under SP their output is laid out so the sum takes this rank's slice.
    positions: tuple[str, ...] = ()
    # Layers whose per-head input (MPT's ALiBi bias) is sliced to this rank's heads, and how.
    head_inputs: tuple[tuple[str, PerHeadInput], ...] = ()
    # The module holding the token embedding modifies its output in place (CTRL scales it,
    # Git adds the positions into it): a vocab-parallel style must hand out a copy, not a view.
    embedding_modified_in_place: bool = False
    # The token embedding scales its own lookup (Gemma's ScaledWordEmbedding, an embed_scale): the
    # scale is applied to each rank's partial lookup before the reduction (local_lookup).
    embedding_scaled: bool = False
    # Other vocabulary-sized tables outside the layers, looked up by token (Gemma 4's per-layer
    # embeddings, 40 % of its parameters): vocab-parallel, reduced to a whole output; scaled or not.
    token_tables: tuple[tuple[str, bool], ...] = ()
    # Modules whose own forward reads a row of the vocabulary-sharded token embedding's weight
    # (Gemma 4's multimodal model, the pad token's): (the module's path, the embedding's path below it).
    embedding_row_readers: tuple[tuple[str, str], ...] = ()
    # Modules whose own per-feature parameters act on the residual stream (Doge's layer scales).
    residual_parameters: tuple[str, ...] = ()
    # Attention and MLP blocks of further layer stacks (vision or audio towers, a second decoder
    # stack: plangen.plans.synthesis.towers), sharded tensor-parallel only, and the paths of those stacks.
    tower_blocks: tuple[BlockPart, ...] = ()
    tower_stacks: tuple[str, ...] = ()
    per_layer_inputs: PerLayerInputs | None = None  # Gemma 4's per-layer embeddings (plans/per_layer_inputs.py)
    block_stacks: tuple[str, ...] = ()  # lists of blocks beside layers_path, item i of each in layer i (XLM's)

    @property
    def synthesizable(self) -> bool:
        return self.problem is None

    @property
    def sequence_parallel(self) -> bool:
        return self.problem is None and not self.sp_problems


# ---------------------------------------------------------------------------------------------
# The decoder stack, the embedding and the head


def _common_prefix(a: str, b: str) -> int:
    count = 0
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        count += 1
    return count


def find_decoder_stack(model: nn.Module, near: str) -> tuple[str, nn.ModuleList] | None:
    """The ``ModuleList`` of decoder layers: the one nearest ``near`` (the input embedding's path).

    Lists of the blocks transformers declares (``_no_split_modules``) are preferred; among them the
    one sharing the longest path prefix with the token embedding, then the shallowest.
    """
    from plangen.model.module_tree import find_transformer_layers

    declared = {id(m) for m in find_transformer_layers(model)}
    lists = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) and all(has_parameters(c) for c in m)
    ]
    preferred = [(n, m) for n, m in lists if any(id(c) in declared for c in m)] or lists
    if not preferred:
        return None
    return max(preferred, key=lambda item: (_common_prefix(item[0], near), -item[0].count("."), len(item[1])))


@dataclass(frozen=True)
class _Ends:
    """The token embedding and the output head as the model declares them, and which can be sharded."""

    embedding: nn.Module | None
    head: nn.Module | None
    embedding_ok: bool
    head_ok: bool


def _find_ends(model: nn.Module, dims: ModelDims, paths: dict[int, str], found: Findings) -> _Ends:
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    emb = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None

    # A plain embedding: torch's row-parallel style re-registers every parameter below it by name.
    def plain(module: nn.Module) -> bool:
        return isinstance(module, nn.Embedding) and not any(has_parameters(child) for child in module.children())

    # Narrower (or wider) than the hidden size (OPT-350m's 512 into 1024): a replicated projection
    # outside the layers maps it, and the head reads that width back.
    width = emb.weight.shape[-1] if plain(emb) else dims.hidden
    # Musicgen: one embedding and one head per codebook (ModuleLists), each vocabulary-parallel.
    emb_ok = plain(emb) or _each_of(emb, lambda m: plain(m) and m.weight.shape[-1] == dims.hidden)
    # Column-parallel on the vocabulary takes any input width: the whole input is on every rank.
    # RemBERT's head reads output_embedding_size features from a projection outside the layers.
    head_ok = head is not None and (
        is_linear(head) or _each_of(head, lambda m: is_linear(m) and m.in_features == dims.hidden)
    )
    if is_linear(head) and head.in_features not in (dims.hidden, width):
        found.sp_problems.append(
            f"the output head reads {head.in_features} features, not the hidden size {dims.hidden}: "
            "what maps the hidden state to them is not sequence-sharded"
        )
    reader = _weight_reader(model, paths[id(emb)]) if emb_ok else None
    if reader is not None and reader.rows_only and reader.path:
        # Rows only, by a module below the root: read whole from the sharded weight there
        # (EmbeddingRowReadParallel on the reader, which under SP also lets the row meet the
        # sequence-sharded embedding in a torch.where; a plan names no style on the root).
        found.row_readers.append((reader.path, reader.embedding))
    elif reader is not None:
        found.keep(
            paths[id(emb)],
            f"{reader.cls}'s forward reads its weight itself (not rows alone), where a "
            "vocabulary-sharded weight would meet the model's plain tensors",
            "embeddings",
        )
        emb_ok = False
    elif emb is not None and not emb_ok:
        found.keep(paths[id(emb)], f"{type(emb).__name__} is not a (vocab, hidden) nn.Embedding", "embeddings")
    if head is not None and not head_ok:
        found.keep(
            paths[id(head)],
            f"{type(head).__name__} is not an nn.Linear (or one per codebook from the hidden size)",
            "output",
        )
    tied = emb is not None and head is not None and getattr(head, "weight", None) is getattr(emb, "weight", 0)
    if tied and emb_ok != head_ok:
        # One parameter cannot be both sharded and whole: keep the shardable end whole too.
        end, group = (emb, "embeddings") if emb_ok else (head, "output")
        found.keep(paths[id(end)], "tied to the other end, which cannot be sharded", group)
        emb_ok = head_ok = False
    if not emb_ok:
        found.sp_problems.append(
            "the input embedding is not vocabulary-sharded, so nothing puts the residual stream on sequence shards"
        )
    elif width != dims.hidden:
        found.sp_problems.append(
            f"the input embedding is {width} wide, not the hidden size {dims.hidden}: what maps it is not sequence-sharded"
        )
    if head is not None and not head_ok:
        found.sp_problems.append("the output head is not sharded, so nothing gathers the sequence for it")
    return _Ends(emb, head, emb_ok, head_ok)


class _WeightReader(NamedTuple):
    cls: str  # the reading module's class
    path: str  # the reading module's path ("" for the root)
    rows_only: bool  # every read takes one row
    embedding: str  # the embedding's path below the reader


def _weight_reader(model: nn.Module, path: str) -> _WeightReader | None:
    """A module holding the embedding at ``path`` whose forward reads its weight, if any."""
    parts = path.split(".")
    for depth in range(len(parts)):
        owner_path = ".".join(parts[:depth])
        owner = model.get_submodule(owner_path)
        if read_weight_reads(type(owner), parts[-1]):
            rows = read_weight_row_reads(type(owner), parts[-1])
            return _WeightReader(type(owner).__name__, owner_path, rows, ".".join(parts[depth:]))
    return None


def _each_of(module: nn.Module | None, test) -> bool:
    return isinstance(module, nn.ModuleList) and len(module) > 0 and all(test(m) for m in module)


def _end_pattern(module: nn.Module, paths: dict[int, str]) -> str:
    """The plan key of an end: its path, or every member of a per-codebook list."""
    return paths[id(module)] + (".*" if isinstance(module, nn.ModuleList) else "")


def find_position_embeddings(model: nn.Module, embedding: str, dims: ModelDims) -> list[str]:
    """Modules beside the token embedding whose output its parent's forward adds to it: position
    tables (learned, an ``nn.Embedding`` of the hidden width, or parameter-free sinusoids)."""
    parent_path, parent, own = _owner(model, embedding)
    found = []
    for name in sorted(read_added_children(type(parent)) - {own}):
        child = getattr(parent, name, None)
        if not isinstance(child, nn.Module) or is_linear(child):
            continue
        table = isinstance(child, nn.Embedding) and child.weight.shape[-1] == dims.hidden
        if table or not has_parameters(child):
            found.append(f"{parent_path}.{name}" if parent_path else name)
    return found


# ---------------------------------------------------------------------------------------------
# Inside the decoder layers


def _group_of(kind: str) -> str:
    return kind if kind in ("attention", "mlp") else ("mlp" if kind == "moe" else "other")


def _analyze_layer(
    layer: nn.Module, path: str, dims: ModelDims, found: Findings, per_head_input: PerHeadInput | str | None = None
) -> None:
    if own_parameters(layer):
        names = ", ".join(own_parameters(layer))
        # One value per feature or a scalar (Doge's residual scales): whole on every rank; under SP
        # they meet the sequence-sharded residual as Replicate DTensors (SequenceParallelOwnParameters).
        per_feature = all(shape in ((dims.hidden,), ()) for shape in own_parameters(layer).values())
        found.keep(
            path,
            f"the layer's own parameters ({names}) act on the residual stream",
            "other",
            None if per_feature else f"{path} has its own parameters ({names}) on the residual stream",
        )
        if per_feature:
            found.residual_parameters.append(path)
    flat = recognize_layer_mlp(layer, dims)
    for up, down in flat:
        # No block around them: the column-parallel one takes the layer's hidden state itself.
        found.blocks.append(BlockPart(path, ShardedBlock("mlp", (up,), down), None))
    in_flat = {name for pair in flat for name in pair}
    for name, _ in layer.named_children():
        experts = recognize_layer_experts(layer, name, dims)
        if isinstance(experts, LayerExpertsBlock):
            before, after = read_experts_norms(type(layer), name)
            found.blocks.append(BlockPart(f"{path}.{name}", replace(experts, input_norm=before), None))
            for router in experts.routers:
                found.keep(f"{path}.{router}", "the router sees every token on every rank: routing stays exact", "mlp")
            in_flat |= {name, *experts.routers}
            if not all(n and is_per_feature(getattr(layer, n), dims.hidden) for n in (before, after)):
                found.sp_problems.append(
                    f"{type(layer).__name__} routes its flattened hidden state to {name} itself, "
                    "with no norm read on their input and output to gather and scatter the sequence"
                )
    splits = split_blocks_by_child(layer, dims)
    for name, child in layer.named_children():
        child_path = f"{path}.{name}"
        if name in splits and splits[name].inner == name:
            analyze_split(layer, path, splits[name], dims, found)
        if not has_parameters(child) or name in in_flat or name in splits:
            continue
        call = read_block_call(type(layer), name, type(child))
        if is_per_feature(child, dims.hidden):
            found.add_norm(child_path, call)
            continue
        recognized = recognize_block(name, child, dims)
        if isinstance(recognized, WrappedBlock) and per_head_input is None:
            inner = recognized.inner
            inner_call = read_block_call(type(child), inner, type(getattr(child, inner)))
            # Entered where the wrapper calls it (the wrapper hands it the hidden state as it got it).
            found.blocks.append(BlockPart(f"{child_path}.{inner}", recognized.block, inner_call))
            continue
        if isinstance(recognized, WrappedBlock):  # a per-head input is not handed through a wrapper
            recognized = unrecognized(name, child, dims)
        if isinstance(recognized, KeptBlock):
            _place_kept(layer, path, name, child, recognized, call, dims, found)
            continue
        head_rows = read_head_input_rows(type(layer), name, recognized, call, per_head_input)
        if isinstance(recognized, ShardedBlock) and recognized.kind == "attention" and isinstance(head_rows, tuple):
            found.blocks.append(
                BlockPart(child_path, recognized, call, name in read_modified_in_place(type(layer)), head_rows)
            )
            if not head_rows:  # sliced where the layer is called (MPT's position_bias)
                found.head_inputs.append((path, per_head_input))
        elif isinstance(recognized, ShardedBlock) and recognized.kind == "attention" and head_rows is not None:
            why = (
                f"the model computes a tensor per head for all heads outside the attention ({head_rows}: "
                "ALiBi?) and hands it to every layer: sharded by heads, each rank would add every head's values"
            )
            if call is None or call.outputs is None:
                found.keep(
                    child_path,
                    why,
                    "attention",
                    f"{child_path} is replicated ({why}) and the reader cannot follow how its layer calls it",
                )
            else:
                found.keep(child_path, why, "attention")
                found.gathered.append(KeptPart(child_path, call))
        elif (unplaced := recognized.call_problem(call)) is not None:
            # Its style needs the block where the layer calls it, and that call could not be read.
            sp_problem = f"{child_path} is replicated and the reader cannot follow how its layer calls it"
            found.keep(child_path, unplaced.why, unplaced.group, None if unplaced.gathered else sp_problem)
            if unplaced.gathered:
                found.gathered.append(KeptPart(child_path, call))
        elif isinstance(recognized, ShardedBlock):
            found.blocks.append(BlockPart(child_path, recognized, call, name in read_modified_in_place(type(layer))))
        else:
            found.blocks.append(BlockPart(child_path, recognized, call))
            found.kept += recognized.kept_beside(child_path)


def _place_kept(
    layer: nn.Module,
    path: str,
    name: str,
    child: nn.Module,
    kept: KeptBlock,
    call: BlockCall | None,
    dims: ModelDims,
    found: Findings,
) -> None:
    """A child no family shards: half of a block split across children, attention called as a sibling
    is, or kept whole (under SP given the whole sequence where its call could be read)."""
    child_path = f"{path}.{name}"
    if analyze_parent_of_split(child, child_path, dims, found):
        return
    if (alike := recognize_attention_called_alike(layer, name, dims)) is not None:
        found.blocks.append(BlockPart(child_path, alike, call))
    elif call is None or call.outputs is None:
        found.keep(
            child_path,
            kept.why,
            _group_of(kept.kind),
            f"{child_path} is replicated ({kept.why}) and the reader cannot follow how its layer "
            "calls it, so it cannot be given the whole sequence under sequence parallel",
        )
    else:
        found.keep(child_path, kept.why, _group_of(kept.kind))
        found.gathered.append(KeptPart(child_path, call, read_returned_parameters(child)))


def _analyze_outside(
    module: nn.Module,
    path: str,
    anchors: set[int],
    dims: ModelDims,
    found: Findings,
    towers: dict[str, str] | None = None,
) -> None:
    """Modules outside the decoder layers: per-feature ones (final norm) and what stays replicated."""
    if id(module) in anchors or not has_parameters(module):
        return
    in_tower = tower_kept_reason(path, module, towers or {})
    if in_tower is not None and not any(id(m) in anchors for m in module.modules()):
        found.keep(
            path,
            in_tower,
            "other",
            f"{path} ({type(module).__name__}) is part of a tower, whose output "
            "the model merges into the text stream: not proven under sequence parallel",
        )
        return
    if path and is_per_feature(module, dims.hidden):
        found.norms.append(path)
        return
    if path and _is_token_table(module, dims):
        found.token_tables.append((path, is_scaled_embedding(module)))
        return
    if not any(id(m) in anchors for m in module.modules()):
        name = type(module).__name__
        found.keep(
            path,
            f"{name} is outside the text decoder: nothing recognised to shard",
            "other",
            f"{path} ({name}) is outside the decoder layers and not recognised",
        )
        return
    if own_parameters(module):
        names = ", ".join(own_parameters(module))
        found.keep(
            path or type(module).__name__,
            f"own parameters ({names}) outside any recognised module",
            "other",
            f"{path or 'the model'} has its own parameters ({names}) outside any recognised module",
        )
    for name, child in module.named_children():
        _analyze_outside(child, f"{path}.{name}" if path else name, anchors, dims, found, towers)


# ---------------------------------------------------------------------------------------------


def _embedding_sum_problem(
    model: nn.Module, paths: dict[int, str], embedding: nn.Module | None, layers: nn.Module, dims: ModelDims
) -> str | None:
    """Why SP cannot start at an embedding held with other parameters in a module of its own (BERT's
    embeddings: token + position + token type, then a norm), or added to a buffer the module reads
    itself (CTRL's sinusoidal positions): the sum is formed inside that module."""
    if embedding is None:
        return None
    parent_path, parent, name = _owner(model, paths[id(embedding)])
    if buffers := read_added_buffer_reads(parent, name):
        return (
            f"the token embedding is added to {', '.join(buffers)}, a buffer {type(parent).__name__} indexes in its "
            "own forward, where no style can lay the sum out on sequence shards"
        )
    if parent is model or any(m is layers for m in parent.modules()):
        return None
    others = [
        n
        for n, c in parent.named_children()
        if c is not embedding and has_parameters(c) and not is_per_feature(c, dims.hidden)
    ]
    if not others:
        return None
    return (
        f"the token embedding is combined with {', '.join(others)} inside {parent_path} "
        f"({type(parent).__name__}), where no style can lay the sum out on sequence shards"
    )


def _no_hidden_size(config: object) -> str:
    # A model of several stacks (BLT's patcher, encoder, global transformer, decoder) sizes each in a sub-config.
    subs = sorted(
        k for k, v in getattr(config, "__dict__", {}).items() if k.endswith("_config") and hasattr(v, "hidden_size")
    )
    return (
        (
            f"its config states no hidden size of its own, only its stacks' ({', '.join(subs)}): a model of several"
            " stacks is not recognised"
        )
        if subs
        else "its config states no hidden size"
    )


def _failed(class_name: str, problem: str) -> Analysis:
    return Analysis(class_name, None, 0, None, None, (), (), (), (), (), problem)


def analyze_model(model: nn.Module) -> Analysis:
    """Recognise what ``model`` (meta-device is enough) can shard, and what stays replicated and why."""
    class_name = type(model).__name__
    dims = read_dims(model)
    if dims is None:
        return _failed(class_name, _no_hidden_size(getattr(model, "config", None)))
    paths = {id(m): name for name, m in model.named_modules()}
    found = Findings()
    ends = _find_ends(model, dims, paths, found)
    stack = find_decoder_stack(model, paths[id(ends.embedding)] if ends.embedding is not None else "")
    if stack is None:
        return _failed(class_name, "no list of decoder layers found")
    layers_path, layers = stack
    per_head_input = read_layers_head_input(model, layers_path, dims)
    block_stacks = find_block_stacks(model, layers_path, layers, dims)  # XLM's lists of blocks, one per kind
    if block_stacks:
        analyze_block_stacks(model, block_stacks, dims, found)
    for index, layer in enumerate(() if block_stacks else layers):
        _analyze_layer(layer, f"{layers_path}.{index}", layer_dims(model, dims, layer), found, per_head_input)
    # The lists of blocks beside XLM's attentions are its layers, not towers.
    towers = Towers() if block_stacks else analyze_towers(model, layers_path, dims, _analyze_layer)
    found.kept += towers.kept
    anchors = {id(model.get_submodule(p)) for p in (layers_path, *block_stacks)} | {
        id(m) for m in (ends.embedding, ends.head) if m is not None
    }
    anchors |= {id(model.get_submodule(stack.path)) for stack in towers.stacks}
    positions = find_position_embeddings(model, paths[id(ends.embedding)], dims) if ends.embedding_ok else []
    for path in positions:
        anchors.add(id(model.get_submodule(path)))
        if has_parameters(model.get_submodule(path)):
            found.keep(
                path, "position embedding added to the token embedding: a table, whole on every rank", "embeddings"
            )
    per_layer = find_per_layer_inputs(model, layers_path, layers, dims)
    if per_layer is not None:
        anchors |= {id(model.get_submodule(p)) for p in (per_layer.projection, per_layer.norm)}
    embedding_sum = _embedding_sum_problem(model, paths, ends.embedding, layers, dims)
    if embedding_sum is not None:
        found.sp_problems.insert(0, embedding_sum)
    _analyze_outside(model, "", anchors, dims, found, towers.reasons)
    problem = None
    if not found.blocks:
        in_layers = [k.why for k in found.kept if k.pattern.startswith(layers_path + ".")]
        reasons = "; ".join(list(dict.fromkeys(in_layers))[:3]) or "no attention or MLP block recognised"
        problem = f"nothing in its decoder layers can be sharded safely ({reasons})"
    return Analysis(
        class_name=class_name,
        layers_path=layers_path,
        layer_count=len(layers),
        embedding=_end_pattern(ends.embedding, paths) if ends.embedding_ok else None,
        head=_end_pattern(ends.head, paths) if ends.head_ok else None,
        norms=tuple(found.norms),
        blocks=tuple(found.blocks),
        kept=tuple(found.kept),
        gathered=tuple(found.gathered),
        sp_problems=tuple(dict.fromkeys(found.sp_problems)),
        problem=problem,
        positions=tuple(positions),
        head_inputs=tuple(found.head_inputs),
        embedding_modified_in_place=ends.embedding_ok and _modified_in_place(model, paths[id(ends.embedding)]),
        embedding_scaled=ends.embedding_ok and is_scaled_embedding(ends.embedding),
        token_tables=tuple(found.token_tables),
        embedding_row_readers=tuple(found.row_readers),
        residual_parameters=tuple(found.residual_parameters),
        tower_blocks=tuple(towers.blocks),
        tower_stacks=tuple(stack.path for stack in towers.stacks),
        per_layer_inputs=per_layer,
        block_stacks=tuple(p for p in block_stacks if p != layers_path),
    )


def _is_token_table(module: nn.Module, dims: ModelDims) -> bool:
    # A table with a row per token: sharding its rows saves its size for one reduction of its
    # output, which a small table (positions, token types) would not repay.
    return isinstance(module, nn.Embedding) and dims.vocab is not None and module.num_embeddings * 2 >= dims.vocab


def _owner(model: nn.Module, path: str) -> tuple[str, nn.Module, str]:
    """(the parent's path, the parent module, the child's name) of the module at ``path``."""
    parent_path, _, name = path.rpartition(".")
    return parent_path, model.get_submodule(parent_path), name


def _modified_in_place(model: nn.Module, path: str) -> bool:
    _, parent, name = _owner(model, path)
    return name in read_modified_in_place(type(parent))


def is_scaled_embedding(module: nn.Module | None) -> bool:
    """An ``nn.Embedding`` whose own forward scales the lookup by its ``embed_scale`` (Gemma3's
    ``Gemma3TextScaledWordEmbedding``: ``super().forward(input_ids) * self.embed_scale``)."""
    return (
        isinstance(module, nn.Embedding)
        and type(module).forward is not nn.Embedding.forward
        and hasattr(module, "embed_scale")
    )
