"""The line an interrupt ends the command line with. A module of its own that imports nothing but
the C module ``_signal``, so both the entry point (:mod:`gpubench.cli`, before anything else is
imported) and the click group (:mod:`gpubench.cli.app`) use it without importing each other."""

import _signal


def interrupted_line(signum: int) -> str:
    """The line of an interrupt that ends the command line with nothing kept (exit 128 + ``signum``):
    ``gpubench: interrupted by SIGINT``. A run that kept what it measured says the same and what it
    kept (gpubench.kit.finish: ``gpubench: interrupted by SIGINT; kept what was measured: ...``)."""
    name = {_signal.SIGINT: "SIGINT", _signal.SIGTERM: "SIGTERM"}.get(signum, f"signal {signum}")
    return f"gpubench: interrupted by {name}"
