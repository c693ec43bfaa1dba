"""Level-2 rules of the runtime a plan is handed to (``--target``, ``PLANGEN_TARGET``): PG216-PG218.

plangen's own runtime takes what the other rules pass; other runtimes have rules of their own
(:mod:`plangen.plan.targets` says which, read from each runtime's code). Each rule here finds, at the
entry it concerns, what that runtime would refuse or do wrong, with the way out. Under the default
target (``plangen``) none of them finds anything.
"""

from __future__ import annotations

from typing import Iterator

from plangen.check.model_plan import ModelFinding, ModelPlan, ModelRule
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT
from plangen.plan.targets import TARGETS, refused_heads, refuses_moe_key

_TIED_IMPORT = "from plangen.styles import TiedEmbeddingParallel, TiedHeadParallel"


def _attention_key(plan: ModelPlan, kv: bool) -> str | None:
    """The written key of the first attention's key/value projection (``kv``) or query projection:
    the first of its children whose output is that many heads wide, else its first child with a
    written key (a packed projection), else None (the finding goes on the plan)."""
    from plangen.model.module_facts import attention_head_counts

    for name, module in plan.modules.items():
        counts = attention_head_counts(module)
        if counts is None:
            continue
        heads, kv_heads, head_dim = counts
        keyed = [
            (n, m) for n, m in plan.modules.items() if n.startswith(name + ".") and plan.covering.get(n) in plan.written
        ]
        exact = [n for n, m in keyed if getattr(m, "out_features", None) == (kv_heads if kv else heads) * head_dim]
        chosen = exact or [n for n, _ in keyed]
        return plan.covering[chosen[0]] if chosen else None
    return None


# --- PG216: the target's head-count rule ------------------------------------------------------


class TargetHeadsRule(ModelRule):
    code = "PG216"
    title = "the target runtime refuses these head counts at this TP size"
    explanation = (
        "NeMo RL's workers refuse a model whose attention heads or key/value heads the TP size does"
        " not divide, before the first step (v2: NeMo Automodel's `validate_tp_mesh`; v1: the same"
        " asserts in `_parallelize_model`), whatever the plan does about it: plangen's runtime"
        " replicates key/value heads and pads query heads where its plan says so, theirs do not run it."
        " Checked where `--target` or `PLANGEN_TARGET` names such a runtime; the finding names the"
        " TP sizes it accepts."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\nPLANGEN_TP_SIZE = 8\nPLANGEN_TARGET = "nemo-rl-v2"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\nPLANGEN_TP_SIZE = 4\nPLANGEN_TARGET = "nemo-rl-v2"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        target = TARGETS[plan.target]
        refused = refused_heads(target, plan.model.config, plan.tp_size)
        if refused is None:
            return
        yield self.finding(
            f"{target.name} refuses this model at TP {plan.tp_size} ({target.source}): {refused.describe(plan.tp_size)};"
            " plangen's runtime takes this plan as it is (--target plangen)",
            _attention_key(plan, kv=refused.counts[0][0] == "num_key_value_heads"),
        )


# --- PG217: keys on routed experts and routers, where the runtime swaps in MoE code of its own ----


class TargetOwnMoeCodeRule(ModelRule):
    code = "PG217"
    title = "the target runtime swaps in MoE code of its own for this class"
    explanation = (
        "NeMo Automodel (NeMo RL's v2 worker) replaces some Hugging Face MoE classes by its own model"
        " code (0.7.0: Qwen3-MoE and DeepSeek-V3), whose experts are expert-parallel: it refuses TP > 1"
        " for them outright, and any plan key on their experts or routers (`experts`, `router`, `gate`,"
        " a block named `mlp` or `moe`). With `force_hf=True` it loads the Hugging Face class, which takes"
        " this plan as verified. verify cannot see that setting, so this is a warning on each key the"
        " rule refuses (`--strict` fails it); the file `plangen init --target nemo-rl-v2` writes says so"
        " in its header."
    )
    severity = "warning"
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n"
        "from plangen.styles import ExpertsParallel\n\n"
        'PLANGEN_MODEL = "qwen3_moe"\nPLANGEN_TARGET = "nemo-rl-v2"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.experts": ExpertsParallel(output_layouts=Replicate()),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "qwen3_moe"\nPLANGEN_TARGET = "nemo-rl-v2"\ncustom_parallel_plan = {\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        target = TARGETS[plan.target]
        if plan.model_name not in target.own_moe_classes:
            return
        for key in plan.written:
            if refuses_moe_key(key) or any(refuses_moe_key(name) for name in plan.matches.get(key, ())):
                yield self.finding(
                    f"{target.name} swaps in its own {plan.model_name} (expert-parallel), which refuses TP and this"
                    f" key; with {target.own_code_setting} this plan applies as verified",
                    key,
                )


# --- PG218: a tied pair under a runtime that never re-ties -------------------------------------


class TargetRetiesNothingRule(ModelRule):
    code = "PG218"
    title = "the target runtime never re-ties a tied embedding and head"
    explanation = (
        "A tied embedding and head share one weight. With torch's `RowwiseParallel`/`ColwiseParallel`"
        " at the two ends, `parallelize_module` distributes it twice and the model comes out with two"
        " parameters: plangen's runtime and NeMo Automodel (NeMo RL's v2 worker) re-tie them; NeMo RL's"
        " v1 worker and torchtitan-style loops do not, and train two copies. Under such a target the two ends take plangen's pair,"
        " `TiedEmbeddingParallel` and `TiedHeadParallel`, which share the one sharded weight under any"
        " runtime (`plangen init` writes them)."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\nPLANGEN_TARGET = "nemo-rl-v1"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{_TIED_IMPORT}\n\n"
        'PLANGEN_MODEL = "gemma3_text"\nPLANGEN_TARGET = "nemo-rl-v1"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": TiedEmbeddingParallel(input_layouts=Replicate()),\n'
        '    "lm_head": TiedHeadParallel(output_layouts=Replicate()),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.model.module_tree import tied_embeddings
        from plangen.styles.tied import TiedEmbeddingParallel, TiedHeadParallel

        target = TARGETS[plan.target]
        tied = None if target.reties else tied_embeddings(plan.model)
        if tied is None:
            return
        (emb_path, head_path), written = tied, {}
        for path in tied:
            key = plan.covering.get(path)
            written[path] = (key, plan.written.get(key) if key is not None else None)
        (_, emb), (head_key, head) = written[emb_path], written[head_path]
        if emb is None or head is None:  # one end only: PG211; neither: one replicated weight
            return
        if isinstance(emb, TiedEmbeddingParallel) and isinstance(head, TiedHeadParallel):
            return
        yield self.finding(
            f"`{emb_path}` and `{head_path}` share one weight, and {target.name} never re-ties it: these styles"
            " make two parameters there, trained apart; use TiedEmbeddingParallel and TiedHeadParallel"
            " (plangen.styles) at the two ends",
            head_key,
        )
