"""Plan modules written by ``plangen init``: import one as ``generated.llama_plan.custom_parallel_plan``.

Refresh them all with ``python scripts/regenerate.py`` (``--check`` only reports stale files).
"""
