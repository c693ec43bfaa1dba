"""The runtimes a plan is handed to, and what each of them does to a plan (``--target``).

``plangen init --target`` writes the plan the runtime accepts and records the target in the file
(``PLANGEN_TARGET``); ``plangen verify`` runs the target's rules as diagnostics at the entries they
concern (:mod:`plangen.check.rules_target`). Each row is read from the runtime's own code, named
beside it; ``docs/nemo-rl.md`` renders the table. Torch-free: level 1 reads the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Any

DEFAULT_TARGET = "plangen"


class TargetError(ValueError):
    """A target name that names no runtime (one line)."""


@dataclass(frozen=True)
class Target:
    name: str
    runtime: str  # who applies the plan, and how
    reties: bool  # re-ties a tied embedding and head that the plan's styles split into two parameters
    heads_divide_tp: bool  # refuses a model whose attention or key/value heads the TP size does not divide
    refuses_moe_keys: bool  # refuses plan keys on routed experts and routers (NeMo Automodel's MoE rule)
    plan_forms: str  # the ``custom_parallel_plan`` values it resolves
    source: str  # where the row was read


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "plangen",
            "plangen.parallelize.parallelize_model: the plan checked against the model, TP, activation checkpointing, FSDP2",
            reties=True,
            heads_divide_tp=False,  # KV heads replicated, query heads padded where the plan says so
            refuses_moe_keys=False,
            plan_forms="a dict, a dotted path to it or to a function returning it, a module path, a .py file",
            source="plangen/parallelize.py, plangen/plan_source.py",
        ),
        Target(
            "nemo-rl-v2",
            "NeMo RL's DTensor v2 worker (its default): NeMo Automodel's parallelize_model, parallelize_module then fully_shard",
            reties=False,
            heads_divide_tp=True,  # validate_tp_mesh: num_attention_heads and num_key_value_heads % TP
            refuses_moe_keys=True,  # its own MoE model code: _validate_moe_tp_plan
            plan_forms="a dict, a dotted path to it or to a function returning it",
            source="nemo_automodel/components/distributed/parallelizer.py (0.7.0)",
        ),
        Target(
            "nemo-rl-v1",
            "NeMo RL's DTensor v1 worker: nemo_rl.models.dtensor.parallelize._parallelize_model, parallelize_module then fully_shard",
            reties=False,
            heads_divide_tp=True,  # asserts num_key_value_heads and num_attention_heads % TP
            refuses_moe_keys=False,
            plan_forms="a dict; a dotted path to it or to a function where the release resolves it with "
            "import_class_from_path (hydra's get_class, in other releases, resolves none)",
            source="nemo_rl/models/dtensor/parallelize.py",
        ),
        Target(
            "torchtitan",
            "a torchtitan-style loop: parallelize_module with the dict, then fully_shard per block and on the root",
            reties=False,
            heads_divide_tp=False,
            refuses_moe_keys=False,
            plan_forms="the dict, passed from Python",
            source="torchtitan/models/llama3/infra/parallelize.py (apply_tp, apply_fsdp)",
        ),
    )
}


def check_target(name: str) -> Target:
    """The target called ``name``; :class:`TargetError` naming the choices otherwise."""
    target = TARGETS.get(name)
    if target is None:
        raise TargetError(f"{name!r} is not a target; choose one of {', '.join(TARGETS)}")
    return target


@dataclass(frozen=True)
class RefusedHeads:
    """What a head-checking runtime refuses: the counts the TP size does not divide, as
    ``(config attribute, count)`` (key/value heads first), and the TP sizes it accepts."""

    counts: tuple[tuple[str, int], ...]
    accepted: tuple[int, ...]

    def describe(self, tp_size: int) -> str:
        counts = " and ".join(f"{name} ({n})" for name, n in self.counts)
        return f"{counts} must be divisible by the TP size ({tp_size}); it accepts TP {', '.join(map(str, self.accepted))}"


def refused_heads(target: Target, config: Any, tp_size: int) -> RefusedHeads | None:
    """The head counts ``target`` refuses at ``tp_size``, read as those runtimes read them (the text
    config's ``num_attention_heads`` and ``num_key_value_heads``, the latter defaulting to the
    former), or None where it accepts them (or checks none)."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    heads = getattr(text, "num_attention_heads", None) or 0
    kv = getattr(text, "num_key_value_heads", None) or heads
    if not target.heads_divide_tp or tp_size == 1 or not heads:
        return None
    wrong = tuple((name, n) for name, n in (("num_key_value_heads", kv), ("num_attention_heads", heads)) if n % tp_size)
    if not wrong:
        return None
    common = gcd(heads, kv)
    return RefusedHeads(wrong, tuple(t for t in range(1, common + 1) if common % t == 0))
