"""``python -m plangen``: the command line (:mod:`plangen.commands.cli`)."""

from plangen.commands.cli import main

main()
