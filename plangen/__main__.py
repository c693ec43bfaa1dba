"""``python -m plangen``: the command line (:mod:`plangen.cli`)."""

from plangen.cli import main

main()
