"""``gpubench copy``'s descriptor: host<->device copy bandwidth."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="copy",
    help="Host<->device copy bandwidth: pinned vs pageable, H2D, D2H, bidir.",
    command="gpubench.plugins.copy.command",
    docs="docs/copy.md",
    bench="gpubench.plugins.copy.bench",
    more_samples="more samples per point: -n N, or a lower --max-noise with a higher --max-time",
    suite_steps="gpubench.plugins.copy.hooks:suite_steps",
    fleet_checks="gpubench.plugins.copy.hooks:fleet_checks",
    host_memory=True,
    params_schema=params_schema({
        "device": param(["integer", "string"], "CUDA ordinal; \"all\" for all GPUs at once, \"N@all\" for GPU N's share of it"),
        "direction": param("string", "h2d, d2h, bidir-h2d, bidir-d2h, bidir-total, h2d-sm, d2h-sm, d2d or latency"),
        "memory": param("string", "the host memory kind: pinned, pageable, write-combined or registered (device for d2d)"),
        "nbytes": param("integer", "bytes per copy", minimum=0),
    }),
)
