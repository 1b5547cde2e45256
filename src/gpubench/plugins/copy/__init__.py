"""``gpubench copy``: host<->device copy bandwidth (H2D, D2H, bidir; pinned, pageable, write-combined,
registered; nvbandwidth's SM copies, device local copy and host latency)."""

from gpubench.core.plugin import Plugin

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
)
