"""The runtimes a plan is handed to, and what each of them does to a plan (``--target``).

``plangen init --target`` writes the plan the runtime accepts and records the target in the file
(``PLANGEN_TARGET``); ``plangen verify`` runs the target's rules as diagnostics at the entries they
concern (:mod:`plangen.check.rules.model.targets`). Each row is read from the runtime's own code, named
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
    plan_forms: str  # the ``custom_parallel_plan`` values it resolves
    source: str  # where the row was read
    # Classes it replaces by MoE model code of its own unless told not to (``own_code_setting``),
    # code that refuses TP and any plan key on routed experts and routers (:func:`refuses_moe_key`).
    own_moe_classes: tuple[str, ...] = ()
    own_code_setting: str = ""
    # Classes whose own replacement trains wrong whatever the plan, as measured against the
    # unsharded Hugging Face model (tests/test_automodel.py): the setting above avoids it.
    own_classes_measured_wrong: tuple[tuple[str, str], ...] = ()


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "plangen",
            "plangen.parallelize.parallelize_model: the plan checked against the model, TP, activation checkpointing, FSDP2",
            reties=True,
            heads_divide_tp=False,  # KV heads replicated, query heads padded where the plan says so
            plan_forms="a dict, a dotted path to it or to a function returning it, a module path, a .py file",
            source="plangen/parallelize.py, plangen/plan/source.py",
        ),
        Target(
            "nemo-rl-v2",
            "NeMo RL's DTensor v2 worker (its default): NeMo Automodel's parallelize_model, parallelize_module then fully_shard",
            # After TP the embedding's weight is set on the head (parallelizer.py:351): one parameter.
            reties=True,
            # validate_tp_mesh (parallelizer.py:1022-1042), on the Hugging Face classes' path:
            # num_key_value_heads, then num_attention_heads, % TP, whatever the plan replicates.
            heads_divide_tp=True,
            plan_forms="a dict, a dotted path to it or to a function of no arguments returning it",
            source="nemo_automodel 0.7.0, components/distributed/parallelizer.py",
            # Its registry's MoE classes: capabilities.py refuses TP > 1 for them, and
            # moe/tp_plan_validation.py any plan key on their experts and routers.
            own_moe_classes=("Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"),
            own_code_setting="force_hf=True (NeMo RL: the policy's automodel force_hf), which loads the Hugging Face class",
            own_classes_measured_wrong=(
                (
                    "LlamaForCausalLM",
                    "its own LlamaForCausalLM trains model.embed_tokens.weight with a wrong gradient "
                    "(0.16 off at DP 2 x TP 2 under any plan, its own too: nemo-automodel 0.7.0, tests/test_automodel.py)",
                ),
            ),
        ),
        Target(
            "nemo-rl-v1",
            "NeMo RL's DTensor v1 worker: nemo_rl.models.dtensor.parallelize._parallelize_model, parallelize_module then fully_shard",
            reties=False,
            heads_divide_tp=True,  # asserts num_key_value_heads and num_attention_heads % TP
            plan_forms="a dict; a dotted path to it or to a function where the release resolves it with "
            "import_class_from_path (hydra's get_class, in other releases, resolves none)",
            source="nemo_rl/models/dtensor/parallelize.py",
        ),
        Target(
            "torchtitan",
            "a torchtitan-style loop: parallelize_module with the dict, then fully_shard per block and on the root",
            reties=False,
            heads_divide_tp=False,
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
        return (
            f"{counts} must be divisible by the TP size ({tp_size}); it accepts TP {', '.join(map(str, self.accepted))}"
        )


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


# NeMo Automodel's predicate (moe/tp_plan_validation.py, _is_unsafe_moe_tp_module_path): a dot
# segment among these, or a last segment among the leaves.
MOE_REFUSED_SEGMENTS = ("experts", "gate_and_up_projs", "down_projs", "router", "shared_expert_gate", "gate")
MOE_REFUSED_LEAVES = ("mlp", "moe")


def refuses_moe_key(path: str) -> bool:
    """Whether NeMo Automodel's MoE rule refuses a plan key or module path."""
    segments = path.split(".")
    return any(s in MOE_REFUSED_SEGMENTS for s in segments) or segments[-1] in MOE_REFUSED_LEAVES


def render_targets_table() -> str:
    """The table of targets as ``docs/nemo-rl.md`` shows it (a test keeps the doc equal to it)."""
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    rows = [
        "| `--target` | the runtime | re-ties a tied pair | refuses heads the TP size does not divide | swaps in MoE code of its own (refusing TP there) for | `custom_parallel_plan` it takes | read from |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in TARGETS.values():
        own = f"{', '.join(t.own_moe_classes)}, unless {t.own_code_setting}" if t.own_moe_classes else "no class"
        rows.append(
            f"| `{t.name}` | {t.runtime} | {yes(t.reties)} | {yes(t.heads_divide_tp)} | {own} | {t.plan_forms} | {t.source} |"
        )
    return "\n".join(rows) + "\n"
