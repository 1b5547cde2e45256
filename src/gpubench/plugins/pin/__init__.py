"""``gpubench pin``: what ``cudaHostAlloc``, ``cudaHostRegister`` and ``cudaMalloc`` (and their frees)
cost over a size sweep."""

from gpubench.core.plugin import Plugin

PLUGIN = Plugin(
    name="pin",
    help="Cost of page-locking host memory and of cudaMalloc: cudaHostAlloc, cudaHostRegister, frees.",
    command="gpubench.plugins.pin.command",
    docs="docs/pin.md",
    bench="gpubench.plugins.pin.bench",
    more_samples="more samples per point: -n N, or a lower --max-noise with a higher --max-time",
)
