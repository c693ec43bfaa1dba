"""The codes of level 3 (``plangen verify --run``), each with its story, as run.py emits them.

Level 3 has no rule that reads a plan: :mod:`plangen.check.run` applies the plan on worker processes
and turns what they report into findings with these classes (:meth:`ModelRule.finding`). Their
stories sit here, beside run.py, so that module stays about running.
"""

from __future__ import annotations

from plangen.check.model_plan import ModelRule
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT


class FailsAtTpSizeRule(ModelRule):
    """The shapes stage: the plan on a shrunk model, a fake process group of its TP size."""

    level = "run"

    code = "PG301"
    title = "fails at its TP size"
    explanation = (
        "Applied to a shrunk model of the same architecture on a fake process group of the plan's TP"
        " size, in a worker started as training starts its ranks, the plan raised (applying it, in the"
        " forward, or in the backward), lost a gradient, or gave a gradient of the wrong shape. Level 2 ran"
        " the same check in its own process (PG215), so what fails here is what differs in a launched"
        " worker: here a plan that reads the launcher's environment (`LOCAL_RANK`) is another plan there."
        " The finding sits on the entry that caused the failure, found as level 2 finds it (the planned"
        " module whose output stands apart where it failed), else on the key of the module that failed."
    )
    wrong = (
        f"import os\n\n{DTENSOR_IMPORT} Replicate, Shard\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\n'
        'O_PROJ_INPUT = Replicate() if "LOCAL_RANK" in os.environ else Shard(-1)\n'
        "custom_parallel_plan = {\n"
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=O_PROJ_INPUT),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}'
    )


class DiffersFromUnshardedRule(ModelRule):
    """The parity stage: TP=2 over gloo against the unsharded model."""

    level = "run"

    code = "PG302"
    title = "differs from the unsharded model"
    explanation = (
        "At TP=2 over gloo, the logits or a parameter gradient differ from the unsharded model's by"
        " more than 1e-5 (fp32, same weights, same batch). The first parameter that differs, in the"
        " model's order, is named. Here the final norm sees the whole hidden state on every rank, so"
        " summing its gradient over TP counts it twice."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\nfrom plangen.styles import AllReduceParamGrads\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.norm": AllReduceParamGrads(),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )


class RunFailedRule(ModelRule):
    """Either stage: the launch itself failed, or a rank raised while loading or applying the plan."""

    level = "run"

    code = "PG303"
    title = "distributed run failed"
    explanation = (
        "The TP=2 run over gloo did not finish: a rank raised, died or hung (past --timeout), and the"
        " run was ended with every rank killed. A plan must be the same on every rank."
    )
    wrong = (
        f"import os\n\n{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\n'
        'if os.environ.get("RANK", "0") != "0":\n'
        '    raise SystemExit("this plan only knows rank 0")\n'
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\n'
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}'
    )
