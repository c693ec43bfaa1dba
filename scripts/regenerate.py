"""Refresh generated/: the plan module of every class with a hand-written plan, TP and SP variants.

One file per class registered in ``plangen.plans.HAND_WRITTEN`` (``generated/<model_type>_plan.py``)
and, where the class has a sequence-parallel plan, its SP variant (``generated/<model_type>_sp_plan.py``),
each exactly what ``plangen init <model_type> -o <file> --tp-size 2 [--sequence-parallel]`` writes.

    .venv/bin/python scripts/regenerate.py           # rewrite the stale files (old ones kept as *.bak)
    .venv/bin/python scripts/regenerate.py --check   # exit 1 when any file is stale or missing; write nothing

A file is stale when its plan, comments or layout changed; the versions in its header are those it
was made with, so a newer torch or transformers alone does not make it stale (a rewrite records the
installed ones).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = Path("generated")  # relative: the path is written into each file's regenerate command
TP_SIZE = 2

_VERSIONS = re.compile(r"^Made with: +plangen (\S+), transformers (\S+), torch (\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Target:
    class_name: str
    spec: str
    sequence_parallel: bool
    output: Path


def spec_for_class(class_name: str) -> str:
    """The model_type that resolves to ``class_name`` (``llama`` for LlamaForCausalLM), else the class name."""
    import transformers

    from plangen.commands.init import resolve

    from plangen.output.errors import InitError

    model_type = getattr(getattr(getattr(transformers, class_name), "config_class", None), "model_type", None)
    if model_type:
        try:
            if resolve(model_type).model_class.__name__ == class_name:
                return model_type
        except InitError:
            pass
    return class_name


def targets() -> list[Target]:
    """What generated/ must hold, from the registry of hand-written plans (sorted by file name)."""
    from plangen.commands.init import default_output, load_model
    from plangen.plans import HAND_WRITTEN

    found: list[Target] = []
    for class_name in sorted(HAND_WRITTEN):
        spec = spec_for_class(class_name)
        found.append(Target(class_name, spec, False, GENERATED / default_output(spec, False).name))
        try:
            HAND_WRITTEN[class_name](load_model(spec).model, True)
        except ValueError:
            continue  # this class has no sequence-parallel plan
        found.append(Target(class_name, spec, True, GENERATED / default_output(spec, True).name))
    return sorted(found, key=lambda t: t.output.name)


def recorded_versions(text: str) -> dict[str, str] | None:
    match = _VERSIONS.search(text)
    return None if match is None else dict(zip(("plangen", "transformers", "torch"), match.groups()))


def render(target: Target, versions: dict[str, str] | None = None, cache: dict | None = None) -> str:
    from plangen.commands.init import load_model, render_plan_module

    cache = {} if cache is None else cache
    if target.spec not in cache:
        cache[target.spec] = load_model(target.spec)
    return render_plan_module(
        target.spec,
        target.output,
        tp_size=TP_SIZE,
        sequence_parallel=target.sequence_parallel,
        versions=versions,
        loaded=cache[target.spec],
    ).text


def stale(target: Target, cache: dict | None = None) -> bool:
    """Whether ``target``'s file is missing or differs from a fresh render (with its recorded versions)."""
    path = ROOT / target.output
    if not path.is_file():
        return True
    text = path.read_text(encoding="utf-8")
    return render(target, recorded_versions(text), cache) != text


def unexpected_files(wanted: list[Target]) -> list[Path]:
    names = {t.output.name for t in wanted}
    return sorted(p for p in (ROOT / GENERATED).glob("*_plan.py") if p.name not in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    from plangen.output.files import write_plan_file

    wanted = targets()
    cache: dict = {}
    problems = 0
    for target in wanted:
        if not stale(target, cache):
            print(f"up to date: {target.output}")
            continue
        if args.check:
            print(f"stale: {target.output} (run: python scripts/regenerate.py)")
            problems += 1
            continue
        outcome = write_plan_file(target.output, render(target, None, cache), force=True)
        kept = f" (previous kept as {outcome.backup})" if outcome.backup else ""
        print(f"wrote: {target.output}{kept}")
    for path in unexpected_files(wanted):
        print(f"not made by any hand-written plan: {path.relative_to(ROOT)} (delete it if it is obsolete)")
        problems += 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
