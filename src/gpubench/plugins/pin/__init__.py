"""``gpubench pin``'s descriptor: the cost of pinning host memory and of cudaMalloc."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="pin",
    help="Cost of page-locking host memory and of cudaMalloc: cudaHostAlloc, cudaHostRegister, frees.",
    command="gpubench.plugins.pin.bench",
    docs="docs/pin.md",
    bench="gpubench.plugins.pin.bench",
    more_samples="more samples per point: -n N, or a lower --max-noise with a higher --max-time",
    params_schema=params_schema({
        "device": param("integer", "CUDA ordinal", minimum=0),
        "operation": param("string", "host-alloc, host-register or malloc"),
        "nbytes": param("integer", "bytes allocated", minimum=0),
        "phase": param("string", "which call of the pair: alloc, free, register or unregister"),
    }),
)
