"""The commands that work on saved results (compare, plot, report, suite), declared as plug-ins
like the measuring commands, so the command line lists and loads every command one way."""

from gpubench.core.plugin import Plugin

COMPARE = Plugin(
    name="compare",
    help="Compare saved results: per-figure change and a noise-aware verdict.",
    command="gpubench.cli.compare",
    gpu="no",
    writes_results=False,
    docs="docs/compare.md",
)
PLOT = Plugin(
    name="plot",
    help="PNG of saved results: sweeps, strategy bars, busbw/algbw, p2p matrices, pairs.",
    command="gpubench.cli.plot",
    gpu="no",
    writes_results=False,
    docs="docs/plot.md",
)
REPORT = Plugin(
    name="report",
    help="One self-contained HTML page of results, comparisons, suites or a fleet.",
    command="gpubench.cli.report",
    gpu="no",
    writes_results=False,
    docs="docs/report.md",
)
SUITE = Plugin(
    name="suite",
    help="Node validation: env, copy, batch, p2p, nccl; expectations from TOML.",
    command="gpubench.cli.suite",
    gpu="suite --check",
    writes_results=False,
    docs="docs/suite.md",
)
METRICS = Plugin(
    name="metrics",
    help="OpenMetrics text of saved results for Prometheus (node_exporter's textfile collector).",
    command="gpubench.cli.metrics",
    gpu="no",
    writes_results=False,
    docs="docs/metrics.md",
)
