"""``gpubench batch``: many small copies, one per piece vs packed through pinned staging vs
``cudaMemcpyBatchAsync`` vs one contiguous copy."""

from gpubench.core.plugin import Plugin

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
)
