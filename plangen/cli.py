"""The command line: each command parses options, calls one core function, prints, and exits.

Heavy imports (torch, transformers) happen inside the commands, so ``--help`` and ``--version``
answer at once. The core never prints or exits; errors reach the user as one line.
"""

from __future__ import annotations

import typer

from plangen import __version__

app = typer.Typer(
    name="plangen",
    help="Generate, verify and apply FSDP2 + tensor-parallel plans for Hugging Face causal LMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Exit codes shared by every command.
EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print a one-line error on stderr and exit."""
    typer.echo(f"plangen: error: {message}", err=True)
    raise typer.Exit(code)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"plangen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """Generate, verify and apply FSDP2 + tensor-parallel plans for Hugging Face causal LMs."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
