"""Setup of each worker process of gpubench's own merge cluster, loaded by dask as a worker preload
(``distributed.worker.preload``, added by merge_cluster.worker_preload).

distributed's UCX comm (the distributed_ucxx package) logs through ``log_errors`` to the logger
"distributed_ucxx.ucxx", outside the "distributed" hierarchy that the Nanny's ``silence_logs``
quiets; with no handler it reaches Python's last-resort handler, which prints a bare traceback when
a comm's write is cancelled as gpubench closes the cluster (after the runs, on Ctrl-C, on a fault).
A fault of the run is reported by the error gpubench raises, so the worker keeps that logger at
CRITICAL, as silence_logs keeps distributed's.
"""

from __future__ import annotations

import logging

QUIET = ("distributed_ucxx",)


def dask_setup(worker=None) -> None:
    """dask's preload hook, called with the Worker being built: quiets QUIET in this process."""
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)
