"""Level-2 rules that run the shrunk model: the layouts followed through each block (PG214), and
one forward and backward on a fake process group at the plan's TP size (PG215).

Both read :attr:`plangen.check.model_plan.ModelPlan.shrunk` (the architecture at toy sizes, on
CPU) and skip where it cannot be built. PG214 plays each style's part from its facts
(:mod:`plangen.check.flow`); PG215 applies the plan with the runtime itself
(:mod:`plangen.check.fake_run`) and runs only where every other level-2 rule found no error
(:func:`plangen.check.model.check_rules`), so it reports what they cannot see.
"""

from __future__ import annotations

from typing import Iterator

from plangen.check.model_plan import ModelFinding, ModelPlan, ModelRule
from plangen.check.shrunk import one_thread
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT


class LayoutFlowRule(ModelRule):
    code = "PG214"
    runs_on_shrunk_model = True
    title = "layouts do not meet"
    explanation = (
        "Level 2 follows the layouts through one forward of the shrunk model: what each style takes and"
        " leaves (a plain local tensor or a DTensor, whole or this rank's shard on some dim), from its"
        " facts, to where the next module reads it, through the attention, the activation and the residual"
        " adds between. Where they cannot meet, the finding sits on the entry whose layout stands apart:"
        " a projection leaving another layout than its siblings and than its reader takes (`q_proj`"
        " row-parallel, its output whole, beside `k_proj` and `v_proj` leaving shards for `o_proj`), a"
        " reader taking another layout than everything it reads (`down_proj` with `input_layouts=Shard(0)`),"
        " an embedding whose output every layer reads otherwise (`output_layouts=Shard(0)`), or a block that"
        " hands a DTensor (`use_local_output=False`) to a module with no entry, whose plain weights torch"
        " refuses to mix with it (a deleted `up_proj`)."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Shard\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(output_layouts=Shard(1)),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Shard\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(output_layouts=Shard(-1)),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.check.flow import find_layout_conflicts, iter_conflicts_by_entry, trace_junctions

        shrunk = plan.shrunk
        if shrunk is None:
            return
        try:
            with one_thread():
                junctions = trace_junctions(shrunk.model, shrunk.styles, shrunk.input_ids)
        except Exception:  # noqa: BLE001 - the unsharded model does not run: PG215 says why, if the plan is to blame
            return
        for conflict in iter_conflicts_by_entry(find_layout_conflicts(junctions)):
            yield self.finding(conflict.message, conflict.blame)


class FakeRunRule(ModelRule):
    code = "PG215"
    runs_on_shrunk_model = True
    title = "fails on a fake process group"
    explanation = (
        "Where every other level-2 rule passes, the plan is applied by the runtime"
        " (`parallelize_model`) to the shrunk model at the plan's TP size on a single-process fake process"
        " group (collectives do nothing, every shape is real), and one forward and backward run: applying"
        " it, the forward or the backward raised, the logits have the wrong shape, or a parameter lost its"
        " gradient. The finding sits on the entry that caused it, not on the module that crashed: the"
        " planned module whose output stands apart (plain or DTensor, which dims split, against the"
        " unsharded model) from the others that meet where it failed, else the failing module's own entry."
        " Here `ReplicatedWithGradAllReduce`, meant for a per-head norm, labels the final norm's input as"
        " split on its last dim, which its weight no longer matches. `plangen verify --run` then checks the"
        " numbers against the unsharded model over gloo."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\nfrom plangen.styles import ReplicatedWithGradAllReduce\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.norm": ReplicatedWithGradAllReduce(),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.check.fake_run import describe_module, run_on_fake_group

        shrunk = plan.shrunk
        if shrunk is None:
            return
        try:
            with one_thread():
                failure = run_on_fake_group(shrunk.model, shrunk.written, plan.tp_size, bool(plan.sequence_parallel))
        except Exception:  # noqa: BLE001 - no fake group here (a real one is running), or the model does not run
            return
        if failure is None:
            return
        what = {"apply": "applying the plan", "shapes": "the shapes"}.get(failure.stage, f"the {failure.stage}")
        yield self.finding(
            f"at TP={plan.tp_size} on a fake process group, {what} fails{describe_module(failure.module)}:"
            f" {failure.error}",
            failure.key,
        )
