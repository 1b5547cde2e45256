"""``python -m gpubench`` runs the command line."""

import _signal  # the C module: the Python-level ``signal`` spends milliseconds building its enums

_early_signal: list = []


def _before_the_cli(signum, frame):
    """SIGINT / SIGTERM while the command line is still being imported (a few hundred ms on a
    loaded host): noted, and acted on once the import is done (nothing was measured yet)."""
    _early_signal.append(signum)


if __name__ == "__main__":
    _mine = []
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # an ignored SIGINT stays ignored
        _signal.signal(_signal.SIGINT, _before_the_cli)
        _mine.append(_signal.SIGINT)
    if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
        _signal.signal(_signal.SIGTERM, _before_the_cli)
        _mine.append(_signal.SIGTERM)
    import os
    import sys

    from gpubench.cli.app import main
    from gpubench.core import signals

    # straight to the CLI's own handler (core/signals.install keeps it): never a moment with
    # Python's default SIGINT handler, whose KeyboardInterrupt would be a traceback out here
    for _sig in _mine:
        _signal.signal(_sig, signals.on_signal)
    if _early_signal:
        sys.stderr.write("gpubench: interrupted\n" if _early_signal[0] == _signal.SIGINT else "gpubench: terminated\n")
        sys.stderr.flush()
        os._exit(128 + _early_signal[0])
    try:
        main()
    finally:
        # A Ctrl-C that lands while code compiled from a string runs (dataclasses and namedtuple
        # build their methods with exec/eval; imports do this a lot) sets CPython's "unhandled
        # KeyboardInterrupt" flag even when gpubench catches it, and under -m Py_RunMain then ends
        # the process by SIGINT (-2) instead of with gpubench's exit code (130). Evaluating a string
        # resets the flag (pythonrun.c run_eval_code_obj); a console script never sets it.
        exec("pass")
