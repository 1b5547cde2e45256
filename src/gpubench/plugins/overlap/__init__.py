"""``gpubench overlap``: H2D -> kernel -> D2H on one stream vs split into chunks over N streams."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="overlap",
    help="Copy/compute overlap: H2D -> kernel -> D2H on one stream vs chunks on N streams.",
    command="gpubench.plugins.overlap.command",
    docs="docs/overlap.md",
    bench="gpubench.plugins.overlap.bench",
    more_samples="more samples per figure: -n N or a longer --min-time",
    plot_kind="bars",
    host_memory=True,
    params_schema=params_schema({
        "device": param("integer", "CUDA ordinal", minimum=0),
        "work": param("integer", "FMAs per element of the kernel", minimum=0),
        "streams": param("integer", "CUDA streams", minimum=1),
        "chunks": param("integer", "chunks the buffer is cut into", minimum=1),
        "nbytes": param("integer", "bytes of the buffer", minimum=0),
        "stage": param("string", "h2d, kernel, d2h (each alone), serial or overlapped"),
    }),
)
