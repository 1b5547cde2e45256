"""``gpubench nccl``: NCCL collectives with nccl-tests' options, algbw and busbw; one process for all
GPUs, one per GPU under a launcher, or over Dask. Its parts stay inside this package: the
collectives table, communicators, data, CUDA graphs, launcher ranks and the Dask path."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="nccl",
    help="NCCL collectives (all-reduce, all-gather, ...): algbw and busbw as nccl-tests.",
    command="gpubench.plugins.nccl.command",
    docs="docs/nccl.md",
    bench="gpubench.plugins.nccl.bench",
    more_samples="more samples per point: --samples N (-n is the iterations within one sample)",
    added_options={"cuda_graph": 0},
    compare_notes="gpubench.plugins.nccl.hooks:compare_notes",
    plot_kind="collective",
    x_name="size S (bytes per rank, nccl-tests' size)",
    suite_steps="gpubench.plugins.nccl.hooks:suite_steps",
    fleet_checks="gpubench.plugins.nccl.hooks:fleet_checks",
    fleet_stage="gpubench.plugins.nccl.hooks:fleet_stage",
    params_schema=params_schema({
        "collective": param("string", "the collective (all-reduce, all-gather, ...)"),
        "nbytes": param("integer", "S, nccl-tests' size: bytes per rank", minimum=0),
        "dtype": param("string", "the element type (float, half, int8, ...)"),
        "placement": param("string", "in-place or out-of-place"),
        "nranks": param("integer", "ranks in the communicator", minimum=1),
    }, {
        "op": param("string", "the reduction (sum, prod, max, min, avg) of a reducing collective"),
        "root": param("integer", "the root rank of a rooted collective", minimum=0),
    }),
)
