"""Byte counts as people read them. No torch here: the plots (plangen.cost.plot) label with it too."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """Binary units, three significant figures: ``1.50 GiB``, ``812 MiB``, ``0 B``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


def format_margin(margin: int) -> str:
    """What a GPU has left at the peak: ``margin 5.85 GiB``, or ``short by 1.2 GiB`` where it does not fit."""
    return f"margin {format_bytes(margin)}" if margin >= 0 else f"short by {format_bytes(-margin)}"
