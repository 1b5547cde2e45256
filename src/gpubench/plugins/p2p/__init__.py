"""``gpubench p2p``: the GPU<->GPU copy matrix (copy engine write/read, bidir, SM copy, latency; peer
access on and off)."""

from gpubench.core.plugin import Plugin

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
)
