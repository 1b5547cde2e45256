"""merge's data: the two random frames dask-cuda's local_cudf_merge joins (copied from dask-cuda
26.10) and the check of the join's result. cuDF/CuPy or pandas/numpy and Dask are imported inside
the functions; generate_chunk runs on the workers.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from gpubench.launch.scheduler import results_within, wait_watching


# -- Data generation: dask-cuda 26.10 benchmarks/local_cudf_merge.py generate_chunk, unchanged in
# substance (Copyright (c) 2019-2026, NVIDIA CORPORATION & AFFILIATES, Apache-2.0), after
# https://gist.github.com/rjzamora/0ffc35c19b5180ab04bbf7c793c45955.


def generate_chunk(input: tuple) -> Any:
    """One partition of the "build" (base) or "other" frame, as dask-cuda makes it.

    ``input``: (i_chunk, local_size, num_chunks, chunk_type, frac_match, gpu). Returns a cudf or
    pandas DataFrame of ``local_size`` rows of int64 columns: "build" key, shuffle, payload; "other"
    key, payload. Seeded with 2**32 - 1 on every call (dask-cuda's choice).
    """
    i_chunk, local_size, num_chunks, chunk_type, frac_match, gpu = input
    if gpu:
        import cudf as xdf
        import cupy as xp
        import dask_cudf  # noqa: F401  (registers the cudf dataframe backend)
    else:
        import numpy as xp
        import pandas as xdf

    xp.random.seed(2**32 - 1)
    chunk_type = chunk_type or "build"
    frac_match = frac_match or 1.0
    if chunk_type == "build":
        start = local_size * i_chunk
        stop = start + local_size
        parts_array = xp.arange(num_chunks, dtype="int64")
        suffle_array = xp.repeat(parts_array, math.ceil(local_size / num_chunks))
        return xdf.DataFrame({"key": xp.arange(start, stop=stop, dtype="int64"),
                              "shuffle": xp.random.permutation(suffle_array)[:local_size],
                              "payload": xp.random.permutation(xp.arange(local_size, dtype="int64"))})
    sub_local_size = local_size // num_chunks
    sub_local_size_use = max(int(sub_local_size * frac_match), 1)
    arrays = []
    for i in range(num_chunks):
        bgn = (local_size * i) + (sub_local_size * i_chunk)
        end = bgn + sub_local_size
        ar = xp.arange(bgn, stop=end, dtype="int64")
        arrays.append(xp.random.permutation(ar)[:sub_local_size_use])
    key_array_match = xp.concatenate(tuple(arrays), axis=0)
    missing_size = local_size - key_array_match.shape[0]
    start = local_size * num_chunks + local_size * i_chunk
    stop = start + missing_size
    key_array_no_match = xp.arange(start, stop=stop, dtype="int64")
    key_array_combine = xp.concatenate((key_array_match, key_array_no_match), axis=0)
    return xdf.DataFrame({"key": xp.random.permutation(key_array_combine),
                          "payload": xp.random.permutation(xp.arange(local_size, dtype="int64"))})


def random_ddf(chunk_size: int, num_chunks: int, frac_match: float, chunk_type: str, gpu: bool,
               no_shuffle: bool = False):
    """A Dask DataFrame of ``num_chunks`` partitions from :func:`generate_chunk` (dask-cuda's
    get_random_ddf); the build frame shuffled by ``set_index("shuffle")`` unless ``no_shuffle``."""
    import dask.dataframe as dd

    meta = generate_chunk((0, 4, 1, chunk_type, None, gpu))
    parts = [(i, chunk_size, num_chunks, chunk_type, frac_match, gpu) for i in range(num_chunks)]
    ddf = dd.from_map(generate_chunk, parts, meta=meta, divisions=[None] * (num_chunks + 1))
    if chunk_type == "build":
        if not no_shuffle:
            return ddf.set_index("shuffle", divisions=tuple(range(num_chunks)) + (num_chunks,))
        del ddf["shuffle"]
    return ddf


# -- Small values computed on the cluster, and the check of the join -----------------------------------


def compute_watching(client, values: Sequence[Any], workers: Mapping[str, int], timeout_s: float, what: str) -> list:
    """dask.compute of small lazy values on the cluster, watched as wait_watching, fetched within --timeout."""
    futs = client.compute(list(values))
    wait_watching(client, futs, workers, timeout_s, what)
    return results_within(client, futs, workers, timeout_s, what)


def join_check(client, joined, workers: Mapping[str, int], timeout_s: float) -> dict[str, int]:
    """Rows of the join and sums of its columns: {"rows", "key_sum", "payload_x_sum", "payload_y_sum"}."""
    df = joined.reset_index() if "key" not in joined.columns else joined
    rows, k, px, py = compute_watching(
        client, [df.shape[0], df["key"].sum(), df["payload_x"].sum(), df["payload_y"].sum()], workers,
        timeout_s, "the join check")
    return {"rows": int(rows), "key_sum": int(k), "payload_x_sum": int(px), "payload_y_sum": int(py)}
