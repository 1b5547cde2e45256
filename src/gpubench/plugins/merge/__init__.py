"""``gpubench merge``: dask-cuda's cuDF merge over tcp or ucx with RMM pools (``-t cpu``: pandas on a
plain Dask cluster). Its parts stay inside: the cluster, the data, the per-pair statistics and
the workers' setup."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="merge",
    help="Dask(-CUDA) cuDF merge over tcp or ucx: dask-cuda's local_cudf_merge.",
    command="gpubench.plugins.merge.command",
    gpu="merge -t cpu",
    docs="docs/merge.md",
    bench="gpubench.plugins.merge.bench",
    more_samples="more runs: --runs N",
    suite_steps="gpubench.plugins.merge.hooks:suite_steps",
    fleet_checks="gpubench.plugins.merge.hooks:fleet_checks",
    digit_groups=True,
    params_schema=params_schema({
        "type": param("string", "cpu (pandas) or gpu (cuDF)"),
        "protocol": param("string", "tcp or ucx"),
        "chunk_size": param("integer", "rows per chunk", minimum=1),
        "base_chunks": param("integer", "chunks of the base (left) frame", minimum=1),
        "other_chunks": param("integer", "chunks of the other (right) frame", minimum=1),
        "frac_match": param("number", "fraction of keys that match", minimum=0, maximum=1),
        "broadcast": param("string", "dask-cuda's Broadcast: True, False or default"),
        "n_workers": param("integer", "Dask workers", minimum=1),
        "shuffle_method": param("string", "Dask's shuffle method: tasks, p2p or disk"),
    }),
)
