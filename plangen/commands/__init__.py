"""The command line and the core function of each command it runs.

:mod:`~plangen.commands.cli` parses, calls one core function, prints and exits with a code; the cores
(``init``, ``prove``, ``catalog`` for ``plangen list``, with ``render`` turning a plan into the text
of a plan module) never print. ``plangen verify`` and ``plangen cost`` call :mod:`plangen.check` and
:mod:`plangen.cost`, stages of their own. Importing this package imports no torch.
"""
