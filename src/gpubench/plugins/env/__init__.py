"""``gpubench env``: the machine (GPUs, driver, CUDA, PCIe, NVLink, topology, NUMA); works without a GPU."""

from gpubench.core.plugin import Plugin, params_schema

PLUGIN = Plugin(
    name="env",
    help="The machine: GPUs, driver, CUDA, PCIe, NVLink, topology, NUMA.",
    command="gpubench.plugins.env.command",
    gpu="no",
    docs="docs/env.md",
    params_schema=params_schema({}),  # its result is the machine (env), with no records
)
