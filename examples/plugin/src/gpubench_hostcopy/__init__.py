"""``gpubench hostcopy``: host-to-host copy bandwidth with numpy over a size sweep (no GPU).

An example of a gpubench plug-in in a distribution of its own: this descriptor is all gpubench
reads to list, run, compare, plot, report and check the command (entry point group
``gpubench.plugins`` in this distribution's pyproject.toml)."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="hostcopy",
    help="Host-to-host copy bandwidth with numpy over a size sweep (an example plug-in; no GPU).",
    command="gpubench_hostcopy.command",
    gpu="no",
    docs="examples/plugin/README.md",
    bench="gpubench_hostcopy.bench",
    more_samples="more samples per point: -n N or a longer --min-time",
    plot_kind="sweep",
    x_name="bytes per copy",
    suite_steps="gpubench_hostcopy.hooks:suite_steps",
    fleet_checks="gpubench_hostcopy.hooks:fleet_checks",
    # what its records' params are: the published result schema holds results of hostcopy to it
    params_schema=params_schema({"nbytes": param("integer", "bytes per copy", minimum=1)}),
)
