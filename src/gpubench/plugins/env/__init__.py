"""``gpubench env``: the machine (GPUs, driver, CUDA, PCIe, NVLink, topology, NUMA); works without a GPU."""

from gpubench.core.plugin import Plugin

PLUGIN = Plugin(
    name="env",
    help="The machine: GPUs, driver, CUDA, PCIe, NVLink, topology, NUMA.",
    command="gpubench.plugins.env.command",
    gpu="no",
    docs="docs/env.md",
)
