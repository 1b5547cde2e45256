"""Setup of each worker process of gpubench's own merge cluster, loaded by dask as a worker preload
(``distributed.worker.preload``, added by merge_cluster.worker_preload): the loggers that print
tracebacks while gpubench closes the cluster, outside the "distributed" hierarchy that the
Nanny's ``silence_logs`` quiets, are kept at CRITICAL (a fault of the run is reported by the error
gpubench raises).
"""

from __future__ import annotations

import logging

QUIET = ("distributed_ucxx", "tornado.application", "asyncio")


def quiet() -> None:
    """Set every logger of QUIET to CRITICAL in this process."""
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)


# at import, which the Worker does in its constructor, before it listens or registers
quiet()
