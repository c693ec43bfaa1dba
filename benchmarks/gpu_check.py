"""The GPU check: what CPU and gloo cannot show, measured on one accelerator within a time budget.

One command, run from the repository root where a CUDA device is (nothing is downloaded: the model
configs are the repository's, ``tests/data/model-configs`` and ``tests/tiny_configs.py``)::

    python benchmarks/gpu_check.py                  # --device cuda when there is one, else cpu
    python benchmarks/gpu_check.py --device cpu --tiny --budget-s 60   # what the test suite runs

It writes ``docs/gpu.md`` and ``docs/gpu.json`` (the same figures, for a later run to diff). Every
section runs on one device, on a single-process fake process group (collectives are no-ops; the
local shapes, allocations and kernels are those of one real rank), in a process of its own (a CUDA
error that poisons its process, or a section that hangs, costs that section only):

1. ``peak``: one rank of TP 8 x DP 4 (``--tiny``: TP 2 x DP 2), Llama-3.1-8B and Qwen3-30B-A3B
   dimensions at 2 layers, sequence parallel off and on: a training step (forward,
   :mod:`plangen.loss`, backward, AdamW) on real tensors under ``plangen cost --peak``'s tracker
   (:func:`plangen.cost.validate.run_peak_case`), beside the prediction for the same settings and
   depth (:func:`plangen.cost.peak.measure_peak`), by kind; on CUDA also
   ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` over the step.
2. ``kernels``: each plan kind (dense, tied, KV-head replication, fused, sharded norms, experts whole
   and split, MLA, Mamba2, gated delta net) on a tiny model through ``parallelize_model`` at TP 2 and
   4, bf16: forward, loss and backward without an error or a non-finite value, and the fused SDPA
   kernels that ran.
3. ``drift``: the optimized and the stable Llama plan against TP=1 (``plangen verify --drift``'s
   comparison) with torch's single-process simulation of every rank (``torch.distributed._local_tensor``,
   skipped with the reason where the installed torch lacks it).
4. ``compile``: ``parallelize_model(compile=True)`` of the hand-written Llama and Qwen3-MoE plans
   against eager: compile time (first compiled step less the first eager one) and the median of 10
   steps (forward, loss, backward; CUDA events).

Sections run in that order (the costliest, compile, last), each with a share of the budget that
the ones before it hand on unused; a section stops between its cases at its share, and is stopped
at it otherwise, keeping the cases it finished. The report is rewritten after every section, so
a run killed from outside still leaves one. A figure the device cannot give is named with the
reason (``needs CUDA``); an error is recorded (type and first line) for its case, and the others run.

Exit status: 0 when the check ran and wrote its report, whatever errors its cases recorded (the
report lists them); 1 when the harness itself failed; 2 for a usage error (``--device cuda``
without CUDA).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model-configs"
MARKDOWN = ROOT / "docs" / "gpu.md"
JSON = ROOT / "docs" / "gpu.json"
DEFAULT_BUDGET_S = 420.0
COMMAND = "python benchmarks/gpu_check.py"

# Run order.
SECTIONS = ("peak", "kernels", "drift", "compile")
TITLES = {
    "peak": "1. Peak memory of one rank, measured against `plangen cost --peak`",
    "kernels": "2. Kernels on local shards, every plan kind, bf16",
    "drift": "3. bf16 drift from TP=1, optimized and stable variant (single-process rank simulation)",
    "compile": "4. Per-block compile against eager, hand-written plans",
}
NEEDS_CUDA = "needs CUDA"
MIN_SECTION_S = 5.0  # a section with less left is not started

# The full run's sizes, and --tiny's (the test suite's: seconds on two CPU cores).
PEAK_LAYERS = 2
# --tiny compiles with dynamo and AOTAutograd but not inductor's code generation (aot_eager): on two
# CPU cores inductor takes half a minute a model, past the test suite's budget; the path (every block
# captured whole, the same loss) is the same, the speed is not measured.
FULL = {
    "tp": 8,
    "dp": 4,
    "batch": 1,
    "seq": 4096,
    "kernel_tp": (2, 4),
    "steps": 10,
    "compile_backend": "inductor",
    "peak_sp": (
        (False, True),
        (False, True),
    ),  # per model: sequence parallel off and on
    # Each section's weight in the budget (its share of what is left when it starts).
    "weights": {"peak": 3.0, "kernels": 1.5, "drift": 1.0, "compile": 4.5},
}
TINY = {
    "tp": 2,
    "dp": 2,
    "batch": 2,
    "seq": 64,
    "kernel_tp": (2,),
    "steps": 3,
    "compile_backend": "aot_eager",
    "peak_sp": ((False,), (True,)),  # both settings, one model each
    # Tiny sections cost mostly their process's start: alike.
    "weights": {"peak": 1.0, "kernels": 1.0, "drift": 1.0, "compile": 1.5},
}
# The full run's models (tests/data/model-configs); --tiny's are small ones of the same classes.
MODEL_FILES = {
    "Llama-3.1-8B": "llama-3.1-8b.json",
    "Qwen3-30B-A3B": "qwen3-30b-a3b.json",
}

# Plan kinds of the kernels section: (kind, tests/tiny_configs.py name, sequence parallel, plan);
# configs whose heads split over TP 4 too.
KERNEL_CASES = (
    ("dense", "llama", False, "default"),
    ("tied", "llama-tied", False, "default"),
    ("KV-head replication", "gemma3-1kv", False, "default"),
    ("fused", "phi3-8h", False, "default"),
    ("sharded norms", "olmo2-4kv", True, "default"),
    ("experts whole", "qwen3_moe", False, "default"),
    ("experts split", "mixtral-3-experts", False, "default"),
    ("MLA", "deepseek_v3", False, "default"),
    ("Mamba2", "nemotron_h-no-mlp", False, "default"),  # no MLP layer: 5.5.x has none
    ("gated delta net", "qwen3_5-linear-4h", False, "synthesized"),
)
# Kinds run below the largest TP size, and why.
KERNEL_MAX_TP = {
    "Mamba2": (
        2,
        "the tiny NemotronH's 2 B/C groups split over TP 2 at most; with one group (nemotron_h-1g) "
        "TP 4 fails on CPU too: its attention's k_proj is split below one of its 2 KV heads",
    ),
}
# The fused SDPA kernels, by aten op (the math path decomposes into matmuls: no op of its own).
SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


# ---------------------------------------------------------------------------------------------
# The orchestrator


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.section:
        return run_section_process(args)
    if args.device == "cuda" and not cuda_available():
        print("gpu_check: --device cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    report = run_check(args)
    failed = [
        f"{name}: {s.get('error') or s.get('status')}"
        for name, s in report["sections"].items()
        if s.get("error") or any("error" in row for row in s.get("rows", ()))
    ]
    print(
        f"gpu_check: wrote {args.markdown} and {args.json} in {report['elapsed_s']:.0f} s"
        + (f"; with errors: {'; '.join(failed)}" if failed else "")
    )
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="default: cuda when available",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help="wall-clock budget of the whole check",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny models and few steps (the test suite's run)",
    )
    parser.add_argument("--markdown", type=Path, default=MARKDOWN)
    parser.add_argument("--json", type=Path, default=JSON)
    # One section, in a process of its own (the orchestrator starts it).
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if cuda_available() else "cpu"
    return args


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    """Every section in turn, the report rewritten after each."""
    started = time.time()
    deadline = started + args.budget_s
    report = {
        "schema": 1,
        "command": " ".join([COMMAND, *sys.argv[1:]]) if __name__ == "__main__" else COMMAND,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": args.device,
        "tiny": args.tiny,
        "budget_s": args.budget_s,
        "elapsed_s": 0.0,
        "finished": False,
        "environment": describe_environment(args.device),
        "sections": {},
    }
    for index, name in enumerate(SECTIONS):
        left = deadline - time.time()
        weights = (TINY if args.tiny else FULL)["weights"]
        share = left * weights[name] / sum(weights[n] for n in SECTIONS[index:])
        if share < MIN_SECTION_S:
            report["sections"][name] = {
                "status": "not run: the budget was spent",
                "rows": [],
            }
        else:
            # What a kill from outside leaves: the section that was running, named.
            report["sections"][name] = {
                "status": "running (the check was stopped here)",
                "rows": [],
            }
            write_report(report, args.markdown, args.json)
            report["sections"][name] = run_section_child(name, args, time.time() + share)
        report["elapsed_s"] = time.time() - started
        write_report(report, args.markdown, args.json)
    report["finished"] = True
    write_report(report, args.markdown, args.json)
    return report


def run_section_child(name: str, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """One section in a process of its own, stopped at ``deadline``: its result, whatever it reached."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as folder:
        result_file = Path(folder) / "result.json"
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--section",
            name,
            "--device",
            args.device,
            "--result",
            str(result_file),
            "--deadline",
            str(deadline),
            *(["--tiny"] if args.tiny else []),
        ]
        status, error = run_until(argv, deadline)
        result = json.loads(result_file.read_text()) if result_file.exists() else {"rows": []}
    if result.pop("finished", False) and status != "done":
        # Killed or crashed while exiting (a CUDA teardown), every case done: the figures stand.
        result.setdefault("notes", []).append(f"its process, every case done, then ended: {error or status}")
        status, error = "done", None
    if status.startswith("stopped") and result.get("running"):
        status += f" (in case {result['running']})"
    result["status"] = result.pop("stopped", None) or status
    result["seconds"] = round(time.time() - started, 1)
    result["error"] = result.get("error") or error
    return result


def run_until(argv: list[str], deadline: float) -> tuple[str, str | None]:
    """(status, error) of a section's process, killed with everything it started (inductor's compile
    workers) at ``deadline``."""
    import signal

    # Its own session, so that a kill at the deadline reaches its children too.
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return "stopped at its share of the budget", None
    if process.returncode != 0:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        return (
            "crashed",
            f"exit status {process.returncode}: {lines[-1] if lines else 'no output'}"[:300],
        )
    return "done", None


def describe_environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    from plangen import __version__

    environment = {
        "plangen": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cuda": torch.version.cuda,
        "device_name": platform.processor() or platform.machine(),
    }
    if device == "cuda":
        environment["device_name"] = torch.cuda.get_device_name(0)
        environment["device_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        environment["cudnn"] = torch.backends.cudnn.version()
    return environment


# ---------------------------------------------------------------------------------------------
# One section, in its own process


class Section:
    """What a section reports (rows, figures skipped by name, notes), saved after every case."""

    def __init__(self, result_file: Path, deadline: float) -> None:
        self.result_file, self.deadline = result_file, deadline
        self.data: dict[str, Any] = {
            "rows": [],
            "skipped": {},
            "notes": [],
            "running": None,
        }

    def save(self) -> None:
        write_atomically(self.result_file, json.dumps(self.data, indent=1))

    def cases(self, names: list[str]) -> Iterator[str]:
        """Each case's name in turn while the budget lasts (the case in progress recorded)."""
        for name in names:
            if time.time() > self.deadline:
                self.data["stopped"] = f"stopped at its share of the budget, before case {name}"
                break
            self.data["running"] = name
            self.save()
            yield name
        self.data["running"] = None
        self.save()

    def run_case(self, name: str, measure: Callable[..., dict[str, Any]], *args: Any) -> None:
        """One case's row: ``measure(*args)``'s figures, or its error (type and first line) and no figures."""
        try:
            row = {"case": name, **measure(*args)}
        except Exception as error:  # per case: one failing case must not hide the others
            # The first line for the report; the trace's end in the JSON, for a run no one watched.
            row = {
                "case": name,
                "error": one_line(error),
                "trace": traceback.format_exc()[-2000:],
            }
        self.data["rows"].append(row)
        self.save()


def one_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def run_section_process(args: argparse.Namespace) -> int:
    section = Section(args.result, args.deadline)
    try:
        RUNNERS[args.section](section, args.device, args.tiny)
    except Exception as error:  # the section's own setup: recorded, the orchestrator goes on
        section.data["error"] = one_line(error)
    section.data["running"] = None
    # Done: a kill at the deadline while the process exits stops nothing.
    section.data["finished"] = True
    section.save()
    return 0


# --- 1. peak memory ----------------------------------------------------------------------------


def run_peak(section: Section, device: str, tiny: bool) -> None:
    options, models = TINY if tiny else FULL, peak_models(tiny)
    if device != "cuda":
        section.data["skipped"] = {
            "max_memory_allocated": NEEDS_CUDA,
            "max_memory_reserved": NEEDS_CUDA,
        }
    section.data["notes"].append(
        f"one rank of TP {options['tp']} x DP {options['dp']} on a fake process group, {PEAK_LAYERS} layers, "
        f"{options['batch']} x {options['seq']} tokens, FSDP2 in bf16 over fp32 masters, AdamW (foreach); "
        "predicted: `plangen cost --peak` at the same settings and depth; tracked: the same tracker on the real tensors"
    )
    cases = {
        f"{model}{' SP' if sp else ''}": (model, sp)
        for index, model in enumerate(models)
        for sp in options["peak_sp"][index]
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-peak-") as folder:
        for name in section.cases(list(cases)):
            model, sp = cases[name]
            values = {**models[model], "num_hidden_layers": PEAK_LAYERS}
            section.run_case(
                name,
                measure_peak_case,
                values,
                sp,
                options,
                device,
                Path(folder) / f"{model}.json",
            )


def peak_models(tiny: bool) -> dict[str, dict[str, Any]]:
    """Config values by name: the full run's model files, --tiny's the small Llama and Qwen3-MoE that
    ``tests/test_peak.py`` validates on gloo (:mod:`plangen.cost.validate`)."""
    if tiny:
        from plangen.cost import validate

        return {
            "Llama (small)": validate.LLAMA,
            "Qwen3-MoE (small)": validate.QWEN3_MOE,
        }
    return {name: read_config(file) for name, file in MODEL_FILES.items()}


def read_config(file: str) -> dict[str, Any]:
    return json.loads((CONFIGS / file).read_text())


def measure_peak_case(
    values: dict[str, Any], sp: bool, options: dict[str, Any], device: str, path: Path
) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from plangen.distributed.fake_group import fake_process_group
    from plangen.cost.peak import measure_peak
    from plangen.cost.validate import run_peak_case

    path.write_text(json.dumps(values))
    tp, dp = options["tp"], options["dp"]
    predicted = measure_peak(
        str(path),
        tp_size=tp,
        dp_size=dp,
        seq_len=options["seq"],
        micro_batch=options["batch"],
        sequence_parallel=sp,
    )
    case = {
        "config": values,
        "sp": sp,
        "ac": False,
        "batch": options["batch"],
        "seq_len": options["seq"],
        "device": device,
    }
    with fake_process_group(tp * dp):
        mesh = DeviceMesh(device, torch.arange(tp * dp).view(dp, tp), mesh_dim_names=("dp", "tp"))
        measured = run_peak_case(
            case,
            mesh["dp"],
            mesh["tp"],
            before_step=reset_cuda_peak if device == "cuda" else None,
        )
    row = {
        "phases": {
            p.phase: compare_kinds(dict(p.breakdown.items()), measured["phases"][p.phase]) for p in predicted.phases
        }
    }
    row["predicted_peak"] = predicted.peak.breakdown.total
    row["tracked_peak"] = max(phase["total"] for phase in measured["phases"].values())
    if device == "cuda":
        row["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        row["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        free_cuda_memory()
    if "experts_implementation" in measured:
        row["experts_implementation"] = measured["experts_implementation"]
    return row


def compare_kinds(predicted: dict[str, int], measured: dict[str, Any]) -> dict[str, Any]:
    """One phase: each kind's predicted and tracked bytes; ``differing``: the kinds not byte for byte."""
    return {
        "predicted": predicted,
        "tracked": {k: measured[k] for k in predicted},
        "differing": [k for k in predicted if measured[k] != predicted[k]],
    }


def reset_cuda_peak() -> None:
    free_cuda_memory()
    import torch

    torch.cuda.reset_peak_memory_stats()


def free_cuda_memory() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


# --- 2. kernels on local shards ----------------------------------------------------------------


def run_kernels(section: Section, device: str, tiny: bool) -> None:
    options = TINY if tiny else FULL
    if device != "cuda":
        section.data["skipped"] = {"SDPA backend selection": f"{NEEDS_CUDA} (the CPU kernel that ran is shown)"}
    section.data["notes"].append(
        "tests/tiny_configs.py models in bf16 through parallelize_model (DP 1) on a fake process group: one forward, "
        "plangen.loss and backward; finite: the logits, the loss and every gradient of the rank"
    )
    cases = {
        f"{kind} TP {tp}": (kind, config, sp, plan, tp)
        for tp in options["kernel_tp"]
        for kind, config, sp, plan in KERNEL_CASES
        if tp <= KERNEL_MAX_TP.get(kind, (tp,))[0]
    }
    section.data["notes"] += [
        f"{kind} at TP {tp} at most: {why}"
        for kind, (tp, why) in KERNEL_MAX_TP.items()
        if tp < max(options["kernel_tp"])
    ]
    for name in section.cases(list(cases)):
        section.run_case(name, run_kernel_case, *cases[name], device)


def run_kernel_case(kind: str, tiny: str, sp: bool, plan: str, tp: int, device: str) -> dict[str, Any]:
    import torch

    from plangen.cost.measure import step_loss
    from plangen.distributed.fake_group import fake_process_group
    from plangen.parallelize import parallelize_model

    with fake_process_group(tp):
        model = tiny_model(tiny).to(device=device, dtype=torch.bfloat16)
        dp_mesh, tp_mesh = meshes(device, 1, tp)
        started = time.perf_counter()
        model = parallelize_model(
            model,
            dp_mesh,
            tp_mesh,
            torch.bfloat16,
            sequence_parallel=sp,
            custom_parallel_plan=custom_plan(plan, model, sp),
        )
        model.train()
        ids, positions = batch(model, 2, 8 * tp, device)
        with SdpaKernels() as kernels:
            logits = model(input_ids=ids, position_ids=positions).logits
            loss = step_loss(logits, ids)
            loss.backward()
        synchronize(device)
        seconds = time.perf_counter() - started
    return {
        "kind": kind,
        "model": tiny,
        "tp": tp,
        "sp": sp,
        "plan": plan,
        "finite_logits": finite(logits),
        "finite_loss": finite(loss),
        "finite_grads": all(finite(p.grad) for p in model.parameters() if p.grad is not None),
        "sdpa": sorted(kernels.seen),
        "seconds": round(seconds, 3),
    }


def tiny_model(name: str) -> Any:
    """``name``'s model of ``tests/tiny_configs.py`` (fp32, CPU, seed 0)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from tiny_configs import build_tiny

    return build_tiny(name)


def custom_plan(plan: str, model: Any, sp: bool) -> Any:
    """None: the plan the runtime picks; "synthesized": plangen's synthesized plan for ``model``."""
    if plan == "default":
        return None
    from plangen.styles import build_parallel_styles
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    return build_parallel_styles(build_synthesized_plan(model, sp))


def meshes(device: str, dp: int, tp: int):
    """(DP mesh, TP mesh) over the first ranks of the process's fake group."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh(device, torch.arange(dp * tp).view(dp, tp), mesh_dim_names=("dp", "tp"))
    return mesh["dp"], mesh["tp"]


def batch(model: Any, rows: int, seq: int, device: str):
    import torch

    from plangen.model.resolve import text_config

    torch.manual_seed(0)
    ids = torch.randint(0, text_config(model.config).vocab_size, (rows, seq), device=device)
    return ids, torch.arange(seq, device=device).expand(rows, seq)


def finite(tensor: Any) -> bool:
    from plangen.stack.torch_compat import local_tensor

    return bool(local_tensor(tensor).float().isfinite().all())


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class SdpaKernels:
    """``with SdpaKernels() as k:`` the fused SDPA kernels that ran inside, in ``k.seen``."""

    def __enter__(self) -> "SdpaKernels":
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = self.seen = set()

        class Recorder(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._overloadpacket.__name__
                if name in SDPA_KERNELS:
                    seen.add(SDPA_KERNELS[name])
                return func(*args, **(kwargs or {}))

        self.mode = Recorder()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


# --- 3. drift ----------------------------------------------------------------------------------


def run_drift(section: Section, device: str, tiny: bool) -> None:
    try:
        from torch.distributed._local_tensor import LocalTensorMode  # noqa: F401
    except ImportError as error:
        import torch

        section.data["skipped"] = {
            "drift": f"torch {torch.__version__} has no torch.distributed._local_tensor ({error})"
        }
        return
    from plangen.check.drift import DRIFT_DTYPES, DRIFT_TP_SIZES

    section.data["notes"].append(
        "the shrunk Llama of `plangen verify --drift`, every rank simulated in one process (LocalTensorMode); "
        "ranks agree: every simulated rank's whole logits are the same"
    )
    cases = {
        f"{variant} TP {tp} {dtype}": (variant, tp, dtype)
        for variant in ("optimized", "stable")
        for dtype in DRIFT_DTYPES
        for tp in DRIFT_TP_SIZES
    }
    with (
        tempfile.TemporaryDirectory(prefix="gpu-check-drift-") as folder,
        drift_setup(device, Path(folder)) as setup,
    ):
        for name in section.cases(list(cases)):
            section.run_case(name, measure_drift_case, *cases[name], setup, device)


@contextmanager
def drift_setup(device: str, folder: Path) -> Iterator[dict[str, Any]]:
    """The fake group of every simulated rank, the shrunk model and batch, each variant's plan file."""
    import torch.distributed as dist

    from plangen.check.drift import WORLD_SIZE
    from plangen.check.shrunk import sample_batch
    from plangen.commands.init import init_plan
    from plangen.model.resolve import resolve_model
    from plangen.model.shrink import build_tiny_model

    dist.init_process_group("fake", rank=0, world_size=WORLD_SIZE)
    base = build_tiny_model(resolve_model("llama"), tp_size=WORLD_SIZE, seed=0)
    plans = {v: str(init_plan("llama", folder / f"llama_{v}.py", variant=v).path) for v in ("optimized", "stable")}
    yield {
        "model": base.to(device),
        "ids": sample_batch(base, WORLD_SIZE).to(device),
        "plans": plans,
        "world": WORLD_SIZE,
    }


def measure_drift_case(variant: str, tp: int, dtype: str, setup: dict[str, Any], device: str) -> dict[str, Any]:
    import copy

    import torch
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    from plangen.check.drift import _differences
    from plangen.check.run import full_tensor
    from plangen.plan.source import load_custom_plan
    from plangen.runtime.tensor_parallel import apply_tp

    world, ids = setup["world"], setup["ids"]
    model = copy.deepcopy(setup["model"]).to(getattr(torch, dtype))
    with torch.no_grad():
        reference = model(input_ids=ids).logits
    # The mesh made outside the simulation, as torch's own LocalTensor tests make theirs.
    mesh = init_device_mesh(device, (world // tp, tp), mesh_dim_names=("rep", "tp"))
    with LocalTensorMode(frozenset(range(world))):
        apply_tp(model, mesh["tp"], load_custom_plan(setup["plans"][variant]))
        with torch.no_grad():
            logits = full_tensor(model(input_ids=ids).logits)
    ranks = list(logits._local_tensors.values()) if isinstance(logits, LocalTensor) else [logits]
    return {
        "variant": variant,
        "tp": tp,
        "dtype": dtype,
        **_differences(ranks[0], reference, ids),
        "ranks_agree": all(torch.equal(ranks[0], r) for r in ranks),
    }


# --- 4. compile --------------------------------------------------------------------------------


def run_compile(section: Section, device: str, tiny: bool) -> None:
    options = TINY if tiny else FULL
    if device != "cuda":
        section.data["skipped"] = {"CUDA events": f"{NEEDS_CUDA} (wall clock, time.perf_counter, instead)"}
    section.data["notes"].append(
        f"one rank of TP {options['tp']} x DP {options['dp']} on a fake process group, "
        f"{'tests/tiny_configs.py models' if tiny else f'{PEAK_LAYERS} layers'}, {options['batch']} x {options['seq']} tokens, "
        f"bf16 compute; a step: forward, plangen.loss, backward; median of {options['steps']} steps after one warm-up"
    )
    models = (
        {"Llama (tiny)": ("tiny", "llama"), "Qwen3-MoE (tiny)": ("tiny", "qwen3_moe")}
        if tiny
        else {name: ("config", file) for name, file in MODEL_FILES.items()}
    )
    for name in section.cases(list(models)):
        section.run_case(name, measure_compile_case, *models[name], options, device)


def measure_compile_case(source: str, model_name: str, options: dict[str, Any], device: str) -> dict[str, Any]:
    from plangen.distributed.fake_group import fake_process_group

    with (
        fake_process_group(options["tp"] * options["dp"]),
        compiling_with(options["compile_backend"]),
    ):
        eager = time_steps(
            build_compile_model(source, model_name, device),
            options,
            device,
            compile=False,
        )
        free_cuda_memory()
        compiled = time_steps(
            build_compile_model(source, model_name, device),
            options,
            device,
            compile=True,
        )
    return {
        "compile_s": round(compiled["first_s"] - eager["first_s"], 2),
        "eager_step_ms": round(1e3 * statistics.median(eager["steps_s"]), 3),
        "compiled_step_ms": round(1e3 * statistics.median(compiled["steps_s"]), 3),
        "compiled_over_eager": round(
            statistics.median(compiled["steps_s"]) / statistics.median(eager["steps_s"]),
            3,
        ),
        "first_loss_gap": abs(compiled["first_loss"] - eager["first_loss"]),
        "timer": "CUDA events" if device == "cuda" else "time.perf_counter",
        "backend": options["compile_backend"],
    }


@contextmanager
def compiling_with(backend: str) -> Iterator[None]:
    """``torch.compile`` with ``backend`` inside (``parallelize_model(compile=True)`` compiles each
    layer with ``layer.compile``, which calls ``torch.compile`` with torch's default, inductor)."""
    import functools

    import torch

    original = torch.compile
    if backend != "inductor":
        torch.compile = functools.partial(original, backend=backend)
    try:
        yield
    finally:
        torch.compile = original


def build_compile_model(source: str, name: str, device: str) -> Any:
    """A model of a tiny config (tests/tiny_configs.py) or a config file at PEAK_LAYERS, on ``device``,
    recording no router logits (they keep the layers eager: docs/compile.md)."""
    import torch

    if source == "tiny":
        model = tiny_model(name).to(device)
    else:
        from plangen.cost.validate import build_config
        from plangen.model.resolve import resolve_model_class

        config = build_config({**read_config(name), "num_hidden_layers": PEAK_LAYERS})
        torch.manual_seed(0)
        with torch.device(device):
            model = resolve_model_class(config)._from_config(config, dtype=torch.float32)
    model.config.output_router_logits = False
    return model


def time_steps(model: Any, options: dict[str, Any], device: str, compile: bool) -> dict[str, Any]:
    import torch

    from plangen.cost.measure import step_loss
    from plangen.parallelize import parallelize_model

    dp_mesh, tp_mesh = meshes(device, options["dp"], options["tp"])
    model = parallelize_model(model, dp_mesh, tp_mesh, torch.bfloat16, compile=compile)
    model.train()
    ids, positions = batch(model, options["batch"], options["seq"], device)
    losses = []

    def step() -> None:
        loss = step_loss(model(input_ids=ids, position_ids=positions).logits, ids)
        loss.backward()
        model.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    started = time.perf_counter()
    step()
    synchronize(device)
    first = time.perf_counter() - started
    step()  # warm-up: a compiled model's second step can still recompile
    steps = [timed(step, device) for _ in range(options["steps"])]
    return {"first_s": first, "steps_s": steps, "first_loss": float(losses[0].float())}


def timed(step: Callable[[], None], device: str) -> float:
    """Seconds of one step: CUDA events on CUDA, the wall clock elsewhere."""
    import torch

    if device != "cuda":
        started = time.perf_counter()
        step()
        return time.perf_counter() - started
    start, end = (
        torch.cuda.Event(enable_timing=True),
        torch.cuda.Event(enable_timing=True),
    )
    start.record()
    step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


RUNNERS: dict[str, Callable[[Section, str, bool], None]] = {
    "peak": run_peak,
    "kernels": run_kernels,
    "drift": run_drift,
    "compile": run_compile,
}


# ---------------------------------------------------------------------------------------------
# The report


def write_atomically(path: Path, text: str) -> None:
    """A reader (or a kill) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
        out.write(text)
    os.replace(out.name, path)


def write_report(report: dict[str, Any], markdown: Path, json_path: Path) -> None:
    write_atomically(json_path, json.dumps(report, indent=1) + "\n")
    write_atomically(markdown, render_markdown(report))


def render_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    on_gpu = report["device"] == "cuda"
    lines = [
        "# GPU check",
        "",
        f"Written by `{COMMAND}`: run it from the repository root where a CUDA device is, with torch (CUDA) and "
        "transformers installed (the repository's plangen is used; nothing is downloaded: the configs are "
        f"`tests/data/model-configs` and `tests/tiny_configs.py`); `--budget-s`, default {DEFAULT_BUDGET_S:.0f} s. "
        "Exit status 0 whenever it ran (the cases' errors are listed below), 1 when the harness itself failed. "
        f"How each figure is made: the script's docstring. Machine-readable: `{JSON.name}` beside this file.",
        "",
        "Commit both files after a GPU run: they replace the CPU report.",
        "",
    ]
    if not on_gpu:
        lines += [
            "**Not yet run on a GPU.** This is the CPU report"
            f"{' of the tiny configuration' if report['tiny'] else ''} (`--device cpu`), committed to show the "
            "report's form until a GPU run replaces it: its figures are CPU tensors on a fake process group, not an "
            f"accelerator's, and each figure only CUDA gives says `{NEEDS_CUDA}`.",
            "",
        ]
    lines += [
        f"- device: {env['device_name']}" + (f" ({env.get('device_memory_gib')} GiB)" if on_gpu else " (CPU)"),
        f"- torch {env['torch']}, CUDA {env['cuda'] or 'none'}"
        + (f", cuDNN {env.get('cudnn')}" if on_gpu else "")
        + f", transformers {env['transformers']}, plangen {env['plangen']}, Python {env['python']}, {env['cpu_cores']} CPU cores",
        f"- date {report['date']}; {'tiny configuration (--tiny); ' if report['tiny'] else ''}budget {report['budget_s']:.0f} s, "
        f"ran {report['elapsed_s']:.0f} s{'' if report['finished'] else ' (still running, or stopped from outside)'}",
        "",
        "| section | status | seconds | cases | errors |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, section in report["sections"].items():
        errors = sum("error" in row for row in section.get("rows", ())) + bool(section.get("error"))
        lines.append(
            f"| {TITLES[name]} | {section.get('status', '')} | {section.get('seconds', 0):.0f} | "
            f"{len(section.get('rows', ()))} | {errors} |"
        )
    for name, section in report["sections"].items():
        lines += ["", f"## {TITLES[name]}", ""]
        if section.get("error"):
            lines += [f"Section error: `{section['error']}`", ""]
        lines += [f"- {figure}: {reason}" for figure, reason in section.get("skipped", {}).items()]
        lines += [f"- note: {note}" for note in section.get("notes", ())]
        lines += [""] + RENDERERS[name](section.get("rows", []))
    return "\n".join(lines).rstrip() + "\n"


def table(columns: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["(no cases ran)"]
    return [
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(columns) - 1)) + " |",
        *("| " + " | ".join(map(str, row)) + " |" for row in rows),
        "",
    ]


def mib(value: Any) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, (int, float)) else NEEDS_CUDA


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.3f}" if isinstance(a, (int, float)) and b else "-"


def errored(row: dict[str, Any], width: int) -> list[str]:
    return [row["case"], f"error: `{row['error']}`", *[""] * (width - 2)]


def render_peak(rows: list[dict[str, Any]]) -> list[str]:
    summary, kinds = [], []
    for row in rows:
        if "error" in row:
            summary.append(errored(row, 7))
            continue
        predicted, allocated = row["predicted_peak"], row.get("max_memory_allocated")
        summary.append(
            [
                row["case"],
                mib(predicted),
                mib(row["tracked_peak"]),
                mib(allocated),
                ratio(allocated, predicted),
                mib(row.get("max_memory_reserved")),
                ratio(row.get("max_memory_reserved"), predicted),
            ]
        )
        for phase, c in row["phases"].items():
            off = ", ".join(f"{k} {ratio(c['tracked'][k], c['predicted'][k])}" for k in c["differing"]) or "none"
            kinds.append(
                [
                    row["case"],
                    phase,
                    mib(sum(c["predicted"].values())),
                    mib(sum(c["tracked"].values())),
                    off,
                ]
            )
    return [
        *table(
            [
                "case",
                "predicted peak",
                "tracked peak",
                "max_memory_allocated",
                "allocated / predicted",
                "max_memory_reserved",
                "reserved / predicted",
            ],
            summary,
        ),
        *table(
            [
                "case",
                "phase",
                "predicted",
                "tracked",
                "kinds not byte for byte (tracked / predicted)",
            ],
            kinds,
        ),
    ]


def table_of_cases(columns: list[str], rows: list[dict[str, Any]], cells) -> list[str]:
    """One table row per case: ``cells(row)``, or the case's recorded error across the columns."""
    return table(columns, [errored(row, len(columns)) if "error" in row else cells(row) for row in rows])


def render_kernels(rows: list[dict[str, Any]]) -> list[str]:
    def cells(row: dict[str, Any]) -> list[str]:
        finite_all = row["finite_logits"] and row["finite_loss"] and row["finite_grads"]
        return [
            row["case"],
            row["model"] + (" (SP)" if row["sp"] else ""),
            "yes" if finite_all else "**no**",
            ", ".join(row["sdpa"]) or "none (math path, or no SDPA)",
            f"{row['seconds']:.2f}",
        ]

    return table_of_cases(["case", "model", "finite", "fused SDPA kernels", "seconds"], rows, cells)


def render_drift(rows: list[dict[str, Any]]) -> list[str]:
    def cells(row: dict[str, Any]) -> list[str]:
        return [
            row["case"],
            f"{row['logits_max']:.3g}",
            f"{row['logits_mean']:.3g}",
            f"{row['logprobs_max']:.3g}",
            "yes" if row["bitwise"] else "no",
            "yes" if row["ranks_agree"] else "**no**",
        ]

    columns = ["case", "logits max", "logits mean", "logprobs max", "bitwise", "ranks agree"]
    return table_of_cases(columns, rows, cells)


def render_compile(rows: list[dict[str, Any]]) -> list[str]:
    def cells(row: dict[str, Any]) -> list[str]:
        return [
            row["case"],
            f"{row['compile_s']:.1f} s",
            f"{row['eager_step_ms']:.2f} ms",
            f"{row['compiled_step_ms']:.2f} ms",
            f"{row['compiled_over_eager']:.2f}x",
            f"{row['first_loss_gap']:.1e}",
        ]

    columns = ["model", "compile time", "eager step", "compiled step", "compiled / eager", "first loss gap"]
    return table_of_cases(columns, rows, cells)


RENDERERS = {
    "peak": render_peak,
    "kernels": render_kernels,
    "drift": render_drift,
    "compile": render_compile,
}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the repository's plangen, whatever else is installed
    sys.exit(main())
