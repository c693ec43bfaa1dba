"""Reading a block's forward source: what the recognizers and the synthesizer know of a module
beyond its parameters (how a layer calls its children, what it adds, what it modifies in place).

:mod:`~plangen.plans.source.forward` is the public home: the parsed forward of a class, its calls
and reads. The other modules answer one narrower question each: packed projections split by index
(``packed``), paired heads (``paired``), shapes read from ``view``/``reshape`` calls (``shape``),
a block split across children and helpers (``split``), widths read from the source (``width``).
"""
