"""``python -m gpubench`` runs the command line."""

import os as _os
import signal as _signal
import sys as _sys


def _before_the_cli(signum, frame):
    """SIGINT / SIGTERM while the command line is still being imported (a few hundred ms on a
    loaded host): nothing was measured yet, so exit 130 / 143 with one line, not a traceback from
    inside an import. The CLI's own handlers (core/signals.install) take over once it runs."""
    _sys.stderr.write("gpubench: interrupted\n" if signum == _signal.SIGINT else "gpubench: terminated\n")
    _os._exit(128 + signum)


if __name__ == "__main__":
    _early = []
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # an ignored SIGINT stays ignored
        _early.append((_signal.SIGINT, _signal.signal(_signal.SIGINT, _before_the_cli)))
    if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
        _early.append((_signal.SIGTERM, _signal.signal(_signal.SIGTERM, _before_the_cli)))
    from gpubench.cli import main

    for _sig, _previous in _early:  # as they were, so core/signals.install recognises them
        _signal.signal(_sig, _previous)
    main()
