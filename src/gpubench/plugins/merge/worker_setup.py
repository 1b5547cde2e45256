"""Setup of each worker process of gpubench's own merge cluster (a worker preload): the loggers that
print tracebacks while gpubench closes the cluster are kept at CRITICAL."""

from __future__ import annotations

import logging

QUIET = ("distributed", "distributed_ucxx", "tornado.application", "asyncio")


def quiet() -> None:
    """Set every logger of QUIET to CRITICAL in this process."""
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)


quiet()
