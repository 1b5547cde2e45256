"""``gpubench p2p``'s descriptor: the GPU<->GPU copy matrix."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="p2p",
    help="GPU<->GPU copy matrix: peer access on/off, read/write, bidir, SM copy, latency.",
    command="gpubench.plugins.p2p.command",
    docs="docs/p2p.md",
    bench="gpubench.plugins.p2p.bench",
    more_samples="more samples per point: -n N",
    suite_steps="gpubench.plugins.p2p.hooks:suite_steps",
    fleet_checks="gpubench.plugins.p2p.hooks:fleet_checks",
    host_memory=True,
    params_schema=params_schema({
        "test": param("string", "write, read, bidir, sm, latency, off, off-bidir or off-latency"),
        "src": param("integer", "the source GPU's CUDA ordinal", minimum=0),
        "dst": param("integer", "the destination GPU's CUDA ordinal", minimum=0),
        "nbytes": param("integer", "bytes per copy", minimum=0),
    }, {
        "part": param("string", "forward, reverse or total, of a bidirectional test"),
    }),
)
