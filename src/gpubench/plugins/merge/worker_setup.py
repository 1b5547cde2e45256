"""Setup of each worker process of gpubench's own merge cluster, loaded by dask as a worker preload
(``distributed.worker.preload``, added by merge_cluster.worker_preload): the loggers that print
tracebacks while gpubench closes the cluster are kept at CRITICAL (a fault of the run is reported
by the error gpubench raises). "distributed" is among them: the cluster's ``silence_logs`` quiets
it in the Nannies, which run in gpubench's own process, not in the worker processes they start
(distributed's WorkerProcess._run takes the level and does not apply it), where a heartbeat on
a connection pool already closed logs "Unexpected exception during heartbeat" with a traceback.
"""

from __future__ import annotations

import logging

QUIET = ("distributed", "distributed_ucxx", "tornado.application", "asyncio")


def quiet() -> None:
    """Set every logger of QUIET to CRITICAL in this process."""
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)


# at import, which the Worker does in its constructor, before it listens or registers
quiet()
