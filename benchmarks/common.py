"""What every benchmark section returns, and how it is printed (rich table, or Markdown for the docs)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Goal:
    name: str
    met: bool
    detail: str


@dataclass
class Section:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return all(goal.met for goal in self.goals)


def render_section_text(section: Section, width: int = 120) -> str:
    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None, highlight=False)
    table = Table(title=section.title, title_justify="left", show_edge=False)
    for i, column in enumerate(section.columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in section.rows:
        table.add_row(*row)
    console.print(table)
    for goal in section.goals:
        console.print(f"{'ok  ' if goal.met else 'MISS'} {goal.name}: {goal.detail}", markup=False)
    for note in section.notes:
        console.print(f"note: {note}", markup=False)
    return out.getvalue()


def render_section_markdown(section: Section) -> str:
    lines = ["", f"### {section.title}", "", "| " + " | ".join(section.columns) + " |"]
    lines.append("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(section.columns))) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in section.rows]
    lines.append("")
    lines += [f"- {'met' if g.met else '**missed**'}: {g.name} ({g.detail})" for g in section.goals]
    lines += [f"- note: {note}" for note in section.notes]
    return "\n".join(lines) + "\n"


def format_ratio(value: float) -> str:
    return f"{value:.2f}x"


def format_mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:.1f} MiB"


def format_gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"
