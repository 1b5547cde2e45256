"""Setup of each worker process of gpubench's own merge cluster, loaded by dask as a worker preload
(``distributed.worker.preload``, added by merge_cluster.worker_preload).

distributed's UCX comm (the distributed_ucxx package) logs through ``log_errors`` to the logger
"distributed_ucxx.ucxx", outside the "distributed" hierarchy that the Nanny's ``silence_logs``
quiets; with no handler it reaches Python's last-resort handler, which prints a bare traceback when
a comm's write is cancelled as gpubench closes the cluster (after the runs, on Ctrl-C, on a fault).
A closing worker's heartbeat can also fail with "ConnectionPool is closed", which tornado logs as a
traceback ("Exception in callback Worker.heartbeat"), and asyncio logs the tasks a cut-short close
leaves. A fault of the run is reported by the error gpubench raises, so the worker keeps these
loggers at CRITICAL from the moment it is built, as silence_logs keeps distributed's.
"""

from __future__ import annotations

import logging

QUIET = ("distributed_ucxx", "tornado.application", "asyncio")


def quiet() -> None:
    """Set every logger of QUIET to CRITICAL in this process."""
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)


# At import, which the Worker does in its constructor (preloading.process_preloads), before it
# listens or registers with the scheduler; dask's dask_setup hook would run only after it listens.
quiet()
