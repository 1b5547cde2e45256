"""``gpubench overlap``: H2D -> kernel -> D2H on one stream vs split into chunks over N streams."""

from gpubench.core.plugin import Plugin

PLUGIN = Plugin(
    name="overlap",
    help="Copy/compute overlap: H2D -> kernel -> D2H on one stream vs chunks on N streams.",
    command="gpubench.plugins.overlap.command",
    docs="docs/overlap.md",
    bench="gpubench.plugins.overlap.bench",
    more_samples="more samples per figure: -n N or a longer --min-time",
    plot_kind="bars",
    host_memory=True,
)
