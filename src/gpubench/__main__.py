"""``python -m gpubench`` runs the command line."""

from gpubench.cli import main

if __name__ == "__main__":
    try:
        main()
    finally:
        # A Ctrl-C that lands while code compiled from a string runs (dataclasses and namedtuple
        # build their methods with exec/eval; imports do this a lot) sets CPython's "unhandled
        # KeyboardInterrupt" flag even when gpubench catches it, and under -m Py_RunMain then ends
        # the process by SIGINT (-2) instead of with gpubench's exit code (130). Evaluating a string
        # resets the flag (pythonrun.c run_eval_code_obj); a console script never sets it.
        exec("pass")
