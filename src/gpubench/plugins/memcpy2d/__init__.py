"""``gpubench memcpy2d``: pitched 2-D copies (``cudaMemcpy2DAsync``) vs a row loop vs one contiguous
copy vs a CuPy slice."""

from gpubench.core.plugin import Plugin

PLUGIN = Plugin(
    name="memcpy2d",
    help="Pitched 2-D copies vs a row-by-row loop vs one contiguous copy vs CuPy slices.",
    command="gpubench.plugins.memcpy2d.command",
    docs="docs/memcpy2d.md",
    bench="gpubench.plugins.memcpy2d.bench",
    more_samples="more samples per point: -n N, or a lower --max-noise with a higher --max-time",
    plot_kind="bars",
    host_memory=True,
)
