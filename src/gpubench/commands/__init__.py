"""Click commands, one module each, imported lazily by :mod:`gpubench.cli`."""
