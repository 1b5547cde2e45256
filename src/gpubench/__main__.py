"""``python -m gpubench`` runs the command line."""

import signal as _signal
import sys as _sys

# A Ctrl-C or SIGTERM while the interpreter imports the command line (before gpubench's own
# handlers are installed) is only recorded, then acted on at once: exit 130 / 143 with one line,
# not a KeyboardInterrupt traceback from inside an import (or one swallowed in an import lock's
# callback and lost).
_early: list = []
if __name__ == "__main__" and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, lambda signum, frame: _early.append(signum))
    _signal.signal(_signal.SIGTERM, lambda signum, frame: _early.append(signum))

from gpubench.cli import main  # noqa: E402

if __name__ == "__main__":
    if _early:
        print("gpubench: interrupted" if _early[0] == _signal.SIGINT else "gpubench: terminated", file=_sys.stderr)
        _sys.exit(128 + _early[0])
    if _signal.getsignal(_signal.SIGTERM) is not _signal.SIG_DFL:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    try:
        main()
    finally:
        # A Ctrl-C that lands while code compiled from a string runs (dataclasses and namedtuple
        # build their methods with exec/eval; imports do this a lot) sets CPython's "unhandled
        # KeyboardInterrupt" flag even when gpubench catches it, and under -m Py_RunMain then ends
        # the process by SIGINT (-2) instead of with gpubench's exit code (130). Evaluating a string
        # resets the flag (pythonrun.c run_eval_code_obj); a console script never sets it.
        exec("pass")
