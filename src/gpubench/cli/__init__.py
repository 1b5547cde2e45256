"""The command line: the click group (:mod:`gpubench.cli.app`) and the commands that work on saved
results (compare, plot, report, suite). The only layer that turns errors into exit codes."""

from gpubench.cli.app import cli, main

__all__ = ["cli", "main"]
