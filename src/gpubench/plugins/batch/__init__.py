"""``gpubench batch``'s descriptor: many small copies, four ways."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="batch",
    help="Many small copies vs packed vs cudaMemcpyBatchAsync vs one contiguous copy.",
    command="gpubench.plugins.batch.command",
    docs="docs/batch.md",
    bench="gpubench.plugins.batch.bench",
    more_samples="more samples per point: -n N, or a lower --max-noise with a higher --max-time",
    plot_kind="bars",
    suite_steps="gpubench.plugins.batch.hooks:suite_steps",
    host_memory=True,
    params_schema=params_schema({
        "device": param("integer", "CUDA ordinal", minimum=0),
        "direction": param("string", "h2d or d2h"),
        "strategy": param("string", "how the pieces move: separate, packed, batched-api or contiguous"),
        "memory": param("string", "the host memory kind: pinned or pageable"),
        "count": param("integer", "pieces per transfer", minimum=1),
        "piece_bytes": param("integer", "bytes per piece", minimum=0),
    }),
)
