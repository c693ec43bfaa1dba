"""The command line: each command parses options, calls one core function, prints, and exits.

Heavy imports (torch, transformers) happen inside the commands, so ``--help`` and ``--version``
answer at once. The core never prints or exits; errors reach the user as one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import typer

from plangen import __version__

if TYPE_CHECKING:  # pragma: no cover
    from plangen.check import VerifyOptions

app = typer.Typer(
    name="plangen",
    help="Generate, verify and apply FSDP2 + tensor-parallel plans for Hugging Face causal LMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Exit codes shared by every command.
EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print a one-line error on stderr and exit."""
    typer.echo(f"plangen: error: {message}", err=True)
    raise typer.Exit(code)


def _version_callback(value: bool) -> None:
    if value:
        from plangen.stack import stack_report

        _, lines = stack_report()
        typer.echo("\n".join([f"plangen {__version__}", *lines]))
        raise typer.Exit()


# What MODEL may be, for every command that takes one (plangen.model.resolve.resolve_model reads them).
MODEL_HELP = "A model_type (llama), a class (LlamaForCausalLM), a config.json or its folder, or a cached hub id."


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """Generate, verify and apply FSDP2 + tensor-parallel plans for Hugging Face causal LMs."""


@app.command()
def init(
    model: str = typer.Argument(
        ...,
        metavar="MODEL",
        help=MODEL_HELP,
        show_default=False,
    ),
    output: str | None = typer.Option(
        None,
        "-o",
        "--output",
        metavar="PATH",
        help="Where to write (default: generated/<name>_plan.py, <name>_sp_plan.py with --sequence-parallel).",
    ),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="Seed with the sequence-parallel plan."),
    tp_size: int = typer.Option(2, "--tp-size", metavar="N", help="TP size the comments' shard shapes are for."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file (kept as PATH.bak)."),
    template: str | None = typer.Option(
        None, "--template", metavar="DIR", help="Templates that override plangen's own (plan.py.j2)."
    ),
    variant: str = typer.Option(
        "optimized",
        "--variant",
        metavar="optimized|stable",
        help="optimized, or stable: no cross-rank sums in the forward (o_proj/down_proj column-parallel on "
        "their gathered input, NeMo RL's numerically stable plan; default output <name>_stable_plan.py).",
    ),
    target: str = typer.Option(
        "plangen",
        "--target",
        metavar="RUNTIME",
        help="The runtime the plan is for: plangen, nemo-rl-v2, nemo-rl-v1 or torchtitan; the plan is one it "
        "accepts, and the file records it (PLANGEN_TARGET).",
    ),
) -> None:
    """Write an editable custom-plan module for MODEL, seeded with its hand-written, synthesized or Hugging Face plan.

    Exit status: 0 written (or already up to date), 2 usage error (nothing written).
    """
    from plangen.commands.init import init_plan
    from plangen.output.errors import InitError

    try:
        result = init_plan(
            model,
            output,
            tp_size=tp_size,
            sequence_parallel=sequence_parallel,
            force=force,
            template_dir=template,
            variant=variant,
            target=target,
        )
    except InitError as error:
        fail(str(error))
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error: {type(error).__name__}: {' '.join(str(error).split())}")
    sp = "on" if result.sequence_parallel else "off"
    if result.unchanged:
        typer.echo(f"plangen: {result.path} is already up to date")
    else:
        typer.echo(f"plangen: wrote {result.path}")
    typer.echo(f"  seed: {result.seed} (TP size {result.tp_size}, sequence parallel {sp})")
    if result.backup is not None:
        typer.echo(f"  the previous {result.path} is kept as {result.backup}")
    typer.echo(f"next: {result.next_command}")


@app.command()
def verify(
    plans: list[str] = typer.Argument(..., metavar="PLAN.py...", help="Plan files to check.", show_default=False),
    model: str | None = typer.Option(
        None,
        "--model",
        metavar="MODEL",
        help="The model the plan is for, as for init (default: the PLANGEN_MODEL a generated file records).",
    ),
    tp_size: int | None = typer.Option(
        None, "--tp-size", min=1, metavar="N", help="The TP size the plan is for (default: PLANGEN_TP_SIZE, else 2)."
    ),
    sequence_parallel: bool | None = typer.Option(
        None,
        "--sequence-parallel/--no-sequence-parallel",
        help="The plan is (not) for sequence parallelism (default: PLANGEN_SEQUENCE_PARALLEL, else as the plan reads).",
        show_default=False,
    ),
    static: bool = typer.Option(False, "--static", help="Level 1 only: the files are read, never run."),
    run: bool = typer.Option(
        False, "--run", help="Also level 3: apply each plan on CPU (fake process group at N, then gloo at TP=2)."
    ),
    timeout: float = typer.Option(
        600.0,
        "--timeout",
        min=1.0,
        metavar="SECONDS",
        help="Time limit of --run, all files together; also of each file's import (at most 60 s).",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Warnings, and files checked without a model (imported only), set the exit status too."
    ),
    output_format: str = typer.Option("text", "--format", metavar="[text|json|github]", help="Output format."),
    drift: bool = typer.Option(
        False,
        "--drift",
        help="With --run: report how far logits and log-probs move from TP=1 at TP 2 and 4 (fp32, bf16).",
    ),
    compile: bool = typer.Option(
        False,
        "--compile",
        help="With --run: the parity run at TP=2 compiles each decoder layer (torch.compile, fullgraph).",
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        metavar="RUNTIME",
        help="The runtime the plan is handed to: plangen, nemo-rl-v2, nemo-rl-v1 or torchtitan; its rules are "
        "checked too (default: the PLANGEN_TARGET a file records, else plangen).",
    ),
) -> None:
    """Check plan files; print findings as PATH:LINE:COL: CODE message (codes: docs/diagnostics.md).

    Levels 1 (the source, never run) and 2 (against the model, meta device) by default; --static
    level 1 alone; --run all three. Exit status: 0 clean (warnings allowed unless --strict),
    1 findings, 2 usage or internal error.
    """
    # Level 1 needs no torch: these imports stay light, and the levels import what they need.
    import os

    from plangen.check import VerifyOptions, VerifyUsageError, verify_plan_files
    from plangen.check.diagnostics import OutputFormat, render

    if static and run:
        fail("--static and --run exclude each other")
    if target is not None:
        from plangen.plan.targets import TargetError, check_target

        try:
            check_target(target)
        except TargetError as error:
            fail(f"--target: {error}")
    if drift and not run:
        fail("--drift runs the plans: add --run")
    if compile and not run:
        fail("--compile runs the plans: add --run")
    if output_format not in {f.value for f in OutputFormat}:
        fail(f"--format must be one of: {', '.join(f.value for f in OutputFormat)}")
    for plan in plans:
        if not os.path.isfile(plan):
            fail(f"{plan}: {'not a file' if os.path.exists(plan) else 'no such file'}")
    options = VerifyOptions(
        model, tp_size, sequence_parallel, static_only=static, run=run, timeout=timeout, compile=compile, target=target
    )

    def progress(line: str) -> None:
        typer.echo(f"plangen: verify --run: {line}", err=True)

    try:
        report = verify_plan_files(plans, options, progress)
        drift_rows = _drift_rows(plans, options, progress) if drift else None
    except OSError as error:
        fail(f"cannot read {error.filename}: {error.strerror}")
    except VerifyUsageError as error:
        fail(str(error))
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error while checking: {type(error).__name__}: {' '.join(str(error).split())}")
    for note in report.notes:
        typer.echo(f"plangen: note: {note}", err=True)
    rendered = render(report.diagnostics, output_format)
    if drift_rows is not None and output_format == "json":
        import json

        from plangen.check.drift import render_drift_json

        rendered = (
            json.dumps({"diagnostics": json.loads(rendered), "drift": render_drift_json(drift_rows)}, indent=2) + "\n"
        )
    elif drift_rows is not None:
        from plangen.check.drift import render_drift_text

        rendered += render_drift_text(drift_rows)
    typer.echo(rendered, nl=False)
    raise typer.Exit(EXIT_FINDINGS if report.failed(strict) else EXIT_OK)


def _drift_rows(plans: list[str], options: "VerifyOptions", progress: Callable[[str], None]) -> list:
    from plangen.check.drift import DRIFT_TP_SIZES, check_drift, drift_cases

    progress(f"drift: {len(plans)} plan(s) at TP {', '.join(map(str, DRIFT_TP_SIZES))} over gloo against TP=1")
    return check_drift(drift_cases(plans, options), timeout=options.timeout)


@app.command()
def cost(
    target: str = typer.Argument(
        ...,
        metavar="PLAN.py|MODEL",
        help="A plan file (its PLANGEN_MODEL names the model), or a MODEL costed with the plan plangen would use.",
        show_default=False,
    ),
    model: str | None = typer.Option(None, "--model", help="The model of a plan file, instead of its PLANGEN_MODEL."),
    tp_size: int | None = typer.Option(
        None, "--tp-size", metavar="N", help="TP size [default: the plan file's, else 2]."
    ),
    dp_size: int = typer.Option(1, "--dp-size", metavar="M", help="FSDP2 (data-parallel) size."),
    seq_len: int = typer.Option(4096, "--seq-len", metavar="L", help="Sequence length of a micro-batch."),
    micro_batch: int = typer.Option(1, "--micro-batch", metavar="B", help="Sequences per micro-batch, per DP rank."),
    dtype: str = typer.Option("bf16", "--dtype", help="Compute and communication dtype (FSDP2 param_dtype)."),
    master_dtype: str = typer.Option("fp32", "--master-dtype", help="Dtype of stored weights, gradients and AdamW."),
    sequence_parallel: bool | None = typer.Option(
        None,
        "--sequence-parallel/--no-sequence-parallel",
        help="[default: the plan file's, else off]",
        show_default=False,
    ),
    compare: str | None = typer.Option(
        None,
        "--compare",
        metavar="hf,hand-written,stable,nemo,PLAN.py...",
        help="Alternatives, each with ratios to the first.",
    ),
    output_format: str = typer.Option("text", "--format", metavar="[text|json]", help="Output format."),
    peak: bool = typer.Option(
        False, "--peak", help="Trace one training step with fake tensors: peak memory per rank, activations included."
    ),
    activation_checkpointing: bool = typer.Option(
        False, "--activation-checkpointing", help="With --peak: checkpoint the decoder layers, as the runtime does."
    ),
    gpu_memory: str | None = typer.Option(
        None, "--gpu-memory", metavar="SIZE", help="With --peak: say whether the peak fits in SIZE (80GiB, 80GB)."
    ),
    every_layer: bool = typer.Option(
        False, "--every-layer", help="With --peak: trace every layer, never extrapolate from 3, 4 and 5 (docs/cost.md)."
    ),
    fit: bool = typer.Option(
        False,
        "--fit",
        help="Trace every TP x DP layout of --world-size (SP, checkpointing): those that fit --gpu-memory.",
    ),
    world_size: int | None = typer.Option(None, "--world-size", metavar="N", help="With --fit: the ranks to lay out."),
    plot: str | None = typer.Option(
        None,
        "--plot",
        metavar="FILE",
        help="With --peak: the step's memory over time, per plan; with --fit: each layout's peak and TP traffic. "
        "FILE.png, .svg or .html (one self-contained page); needs the plot extra: pip install 'plangen[plot]'.",
    ),
) -> None:
    """What a plan costs per rank (weights, gradients, AdamW) and per step (every collective, TP and FSDP2).

    With --peak: the peak memory per rank of one traced training step, split by kind.

    Exit status: 0 printed, 2 usage error.
    """
    if output_format not in ("text", "json"):
        fail("--format must be one of: text, json")
    if plot is not None and not (peak or fit):
        fail("--plot needs --peak or --fit")
    if plot is not None:
        from plangen.cost.plot import check_plot_path
        from plangen.cost.settings import CostError

        try:  # before anything is traced: a trace takes minutes
            check_plot_path(plot)
        except CostError as error:
            fail(str(error))
    if fit:
        _cost_fit(target, model, world_size, gpu_memory, seq_len, micro_batch, dtype, master_dtype, output_format, plot)
        return
    if world_size is not None:
        fail("--world-size needs --fit")
    if not peak and (gpu_memory is not None or activation_checkpointing or every_layer):
        fail("--gpu-memory, --activation-checkpointing and --every-layer need --peak")
    if peak:
        _cost_peak(
            target,
            compare,
            model,
            tp_size,
            dp_size,
            seq_len,
            micro_batch,
            dtype,
            master_dtype,
            sequence_parallel,
            activation_checkpointing,
            gpu_memory,
            output_format,
            every_layer,
            plot,
        )
        return
    # Heavy imports only here: torch, transformers and a fake process group for the measurements.
    import shutil

    from plangen.cost import CostError, build_cost_report
    from plangen.cost.render import render_cost_json, render_cost_text
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # shrunk configs make transformers warn about sizes; not the user's concern
    alternatives = [name.strip() for name in (compare or "").split(",") if name.strip()]
    try:
        report = build_cost_report(
            target,
            alternatives,
            model=model,
            tp_size=tp_size,
            dp_size=dp_size,
            seq_len=seq_len,
            micro_batch=micro_batch,
            dtype=dtype,
            master_dtype=master_dtype,
            sequence_parallel=sequence_parallel,
        )
    except CostError as error:
        fail(str(error))
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error while costing: {type(error).__name__}: {error}")
    if output_format == "json":
        typer.echo(render_cost_json(report), nl=False)
    else:
        typer.echo(render_cost_text(report, width=max(100, shutil.get_terminal_size((110, 24)).columns)), nl=False)


@app.command(name="list")
def list_architectures(
    models: list[str] | None = typer.Argument(
        None, metavar="[MODEL...]", help="Only these model types or classes (default: all).", show_default=False
    ),
    output_format: str = typer.Option("text", "--format", metavar="[text|json]", help="Output format."),
) -> None:
    """Every causal-LM architecture of the installed transformers and the plan it gets at TP > 1.

    Plan: hand-written, synthesized (from the module tree, numerically proven), hf (the model's own
    Hugging Face plan) or none; whether sequence parallelism is available; the numerical check of
    that plan (scripts/sweep_plans.py). Exit status: 0 printed, 2 usage error.
    """
    if output_format not in ("text", "json"):
        fail("--format must be one of: text, json")
    import shutil

    from transformers.utils import logging as hf_logging

    from plangen.commands.catalog import build_catalog, render_catalog_json, render_catalog_text

    hf_logging.set_verbosity_error()  # shrunk default configs make transformers warn; not the user's concern
    try:
        rows = build_catalog(models or None)
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error while listing: {type(error).__name__}: {error}")
    if models and not rows:
        fail(f"no causal-LM architecture is named {', '.join(models)} (pass model types or class names)")
    if output_format == "json":
        typer.echo(render_catalog_json(rows), nl=False)
    else:
        typer.echo(render_catalog_text(rows, width=max(120, shutil.get_terminal_size((160, 24)).columns)), nl=False)


@app.command()
def doctor() -> None:
    """Whether the installed torch and transformers are inside the window plangen is tested on.

    Exit status: 0 inside, 1 outside (plangen runs, but its proofs and tests do not cover the pair:
    `plangen prove CLASS` proves a plan on the installed code), 2 usage error.
    """
    from plangen.stack import stack_report

    inside, lines = stack_report()
    typer.echo("\n".join([f"plangen {__version__}", *lines]))
    raise typer.Exit(EXIT_OK if inside else EXIT_FINDINGS)


@app.command()
def prove(
    model: str = typer.Argument(
        ...,
        metavar="MODEL",
        help=MODEL_HELP,
        show_default=False,
    ),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, metavar="SECONDS", help="Time limit of the runs."),
    output_format: str = typer.Option("text", "--format", metavar="[text|json]", help="Output format."),
) -> None:
    """Prove the plan plangen picks for MODEL's class on the installed model code, and record it.

    Runs verify --run's check (a tiny random model, logits and every gradient against the unsharded
    model within 1e-5) at TP=2 and DP=2 x TP=2, sequence parallel off and on, and records the verdict
    for this code in $PLANGEN_PROOFS (default ~/.cache/plangen/proven.json), which the runtime reads.
    Exit status: 0 proven, 1 not proven (recorded as failed), 2 usage or internal error.
    """
    if output_format not in ("text", "json"):
        fail("--format must be one of: text, json")
    from transformers.utils import logging as hf_logging

    from plangen.commands.prove import ProveError, proof_json, prove_class, render_proof

    hf_logging.set_verbosity_error()

    def progress(line: str) -> None:
        typer.echo(f"plangen: prove: {line}", err=True)

    try:
        proof = prove_class(model, timeout, progress)
    except ProveError as error:
        fail(str(error))
    except OSError as error:
        fail(f"cannot record the proof in {error.filename}: {error.strerror}")
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error while proving: {type(error).__name__}: {' '.join(str(error).split())}")
    typer.echo(proof_json(proof) if output_format == "json" else render_proof(proof), nl=False)
    raise typer.Exit(EXIT_OK if proof.passed else EXIT_FINDINGS)


def _cost_peak(
    target,
    compare,
    model,
    tp_size,
    dp_size,
    seq_len,
    micro_batch,
    dtype,
    master_dtype,
    sequence_parallel,
    activation_checkpointing,
    gpu_memory,
    output_format,
    every_layer,
    plot,
) -> None:
    """``plangen cost --peak``: the subject plan and each --compare alternative, traced with fake tensors."""
    import json

    from plangen.cost.peak import parse_memory
    from plangen.cost.settings import CostError

    try:
        gpu_bytes = None if gpu_memory is None else parse_memory(gpu_memory)
    except CostError as error:
        fail(str(error))
    from plangen.cost.choices import check_plan_name
    from plangen.cost.peak import measure_peak
    from plangen.cost.render import build_peak_json, render_peak_text
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        plans = [None, *(check_plan_name(n.strip()) for n in (compare or "").split(",") if n.strip())]
        reports = [
            measure_peak(
                target,
                plan,
                model=model,
                tp_size=tp_size,
                dp_size=dp_size,
                seq_len=seq_len,
                micro_batch=micro_batch,
                dtype=dtype,
                master_dtype=master_dtype,
                sequence_parallel=sequence_parallel,
                activation_checkpointing=activation_checkpointing,
                extrapolate=not every_layer,
            )
            for plan in plans
        ]
    except CostError as error:
        fail(str(error))
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error while tracing the step: {type(error).__name__}: {error}")
    if output_format == "json":
        typer.echo(json.dumps(build_peak_json(reports, gpu_bytes), indent=2))
    else:
        typer.echo(render_peak_text(reports, gpu_bytes), nl=False)
    if plot is not None:
        from plangen.cost.plot import write_peak_plot

        _write_plot(write_peak_plot, plot, [build_peak_json(reports, gpu_bytes)])


def _write_plot(write: Callable, path: str, documents) -> None:
    """``write(path, documents)``, the --plot of what was just printed; its line on stderr (stdout
    keeps the JSON alone)."""
    from plangen.cost.settings import CostError

    try:
        write(path, documents)
    except CostError as error:
        fail(str(error))
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error while plotting: {type(error).__name__}: {error}")
    typer.echo(f"plangen: wrote {path}", err=True)


def _cost_fit(
    target, model, world_size, gpu_memory, seq_len, micro_batch, dtype, master_dtype, output_format, plot
) -> None:
    """``plangen cost --fit``: the TP x DP layouts of --world-size that fit --gpu-memory."""
    from plangen.cost.peak import parse_memory
    from plangen.cost.settings import CostError

    if world_size is None or gpu_memory is None:
        fail("--fit needs --world-size and --gpu-memory")
    try:
        gpu_bytes = parse_memory(gpu_memory)
    except CostError as error:
        fail(str(error))
    from plangen.cost.fit import search_layouts
    from plangen.cost.render import build_fit_json, render_fit_text
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        search = search_layouts(
            target,
            world_size,
            gpu_bytes,
            seq_len=seq_len,
            micro_batch=micro_batch,
            dtype=dtype,
            master_dtype=master_dtype,
            model=model,
        )
    except CostError as error:
        fail(str(error))
    except Exception as error:  # one line for the user, as for every error of this CLI
        fail(f"internal error while searching layouts: {type(error).__name__}: {error}")
    if output_format == "json":
        import json

        typer.echo(json.dumps(build_fit_json(search), indent=2))
    else:
        typer.echo(render_fit_text(search), nl=False)
    if plot is not None:
        from plangen.cost.plot import write_fit_plot

        _write_plot(write_fit_plot, plot, build_fit_json(search))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
