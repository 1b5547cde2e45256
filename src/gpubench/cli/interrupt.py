"""The line an interrupt ends the command line with (imports nothing but the C module ``_signal``:
the entry point uses it before anything else is imported)."""

import _signal
import sys


def interrupted_line(signum: int) -> str:
    """The line of an interrupt ending the command line (exit 128 + ``signum``): nothing kept, or a complete result."""
    name = {_signal.SIGINT: "SIGINT", _signal.SIGTERM: "SIGTERM"}.get(signum, f"signal {signum}")
    signals = sys.modules.get("gpubench.core.signals")  # not imported here: loaded by then if a run ended
    if signals is not None and signals.result_complete():  # after the report and --json: both are whole
        return f"gpubench: interrupted by {name} after the run; its result is complete"
    return f"gpubench: interrupted by {name}"
