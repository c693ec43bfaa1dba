"""What plangen says and writes: errors on one line, files written whole or not at all.

Torch-free and at the bottom of the package: every stage reports its failures through
:mod:`~plangen.output.errors` and writes its files through :mod:`~plangen.output.files`.
"""
