"""``gpubench memcpy2d``'s descriptor: pitched 2-D copies, four ways."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="memcpy2d",
    help="Pitched 2-D copies vs a row-by-row loop vs one contiguous copy vs CuPy slices.",
    command="gpubench.plugins.memcpy2d.command",
    docs="docs/memcpy2d.md",
    bench="gpubench.plugins.memcpy2d.bench",
    more_samples="more samples per point: -n N, or a lower --max-noise with a higher --max-time",
    plot_kind="bars",
    host_memory=True,
    params_schema=params_schema({
        "device": param("integer", "CUDA ordinal", minimum=0),
        "direction": param("string", "h2d, d2h or d2d"),
        "strategy": param("string", "how the window moves: 2d, row-loop, contiguous or cupy-slice"),
        "memory": param("string", "the host memory kind: pinned or pageable (device for d2d)"),
        "width": param("integer", "bytes per row", minimum=0),
        "height": param("integer", "rows", minimum=0),
        "src_pitch": param("integer", "bytes between row starts in the source", minimum=0),
        "dst_pitch": param("integer", "bytes between row starts in the destination", minimum=0),
    }),
)
