"""The line an interrupt ends the command line with. A module of its own that imports nothing but
the C module ``_signal``, so both the entry point (:mod:`gpubench.cli`, before anything else is
imported) and the click group (:mod:`gpubench.cli.app`) use it without importing each other."""

import _signal
import sys


def interrupted_line(signum: int) -> str:
    """The line of an interrupt that ends the command line with nothing kept (exit 128 + ``signum``):
    ``gpubench: interrupted by SIGINT``; once the complete result was shown and saved,
    ``gpubench: interrupted by SIGINT after the run; its result is complete``. A run that kept what
    it measured says the same and what it kept (gpubench.kit.finish: ``gpubench: interrupted by
    SIGINT; kept what was measured: ...``)."""
    name = {_signal.SIGINT: "SIGINT", _signal.SIGTERM: "SIGTERM"}.get(signum, f"signal {signum}")
    signals = sys.modules.get("gpubench.core.signals")  # not imported here: loaded by then if a run ended
    if signals is not None and signals.result_complete():  # after the report and --json: both are whole
        return f"gpubench: interrupted by {name} after the run; its result is complete"
    return f"gpubench: interrupted by {name}"
