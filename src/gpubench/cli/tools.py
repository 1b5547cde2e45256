"""The commands that work on saved results (compare, plot, report, suite), declared as plug-ins
like the measuring commands, so the command line lists and loads every command one way."""

from gpubench.core.plugin import Plugin


def _tool(name: str, help_: str, gpu: str = "no") -> Plugin:
    return Plugin(name=name, help=help_, command=f"gpubench.cli.{name}", gpu=gpu, writes_results=False,
                  docs=f"docs/{name}.md")


COMPARE = _tool("compare", "Compare saved results: per-figure change and a noise-aware verdict.")
PLOT = _tool("plot", "PNG of saved results: sweeps, strategy bars, busbw/algbw, p2p matrices, pairs.")
REPORT = _tool("report", "One self-contained HTML page of results, comparisons, suites or a fleet.")
SUITE = _tool("suite", "Node validation: env, copy, batch, p2p, nccl; expectations from TOML.", gpu="suite --check")
METRICS = _tool("metrics", "OpenMetrics text of saved results for Prometheus (node_exporter's textfile collector).")
