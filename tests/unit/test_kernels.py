"""core.kernels' host-side parts: the pointer chain the latency test lays into host memory."""

from __future__ import annotations

import numpy as np
import pytest

from gpubench.core import kernels as K


@pytest.mark.parametrize("nbytes", [8, 1000, 8 * (3 << 20) + 5])
def test_the_latency_chain_points_each_node_16_nodes_ahead_by_host_address(nbytes):
    """nvbandwidth's layout (node i -> node (i + 16) mod n, by address), across the 2**20-node
    chunks the layout is computed in and with a partial node at the end left alone."""
    a = np.full(nbytes, 0xAB, dtype=np.uint8)
    n = K.chase_layout(a)
    assert n == nbytes // 8
    i = np.arange(n, dtype=np.uint64)
    want = np.uint64(a.ctypes.data) + ((i + np.uint64(16)) % np.uint64(n)) * np.uint64(8)
    assert (a[: n * 8].view(np.uint64) == want).all()
    assert (a[n * 8:] == 0xAB).all()


def test_the_kernel_cache_folder_follows_gpubench_and_xdg_variables():
    from pathlib import Path

    from gpubench.core import kernel_cache

    assert kernel_cache.cache_dir({"GPUBENCH_CACHE_DIR": "/x/y"}) == Path("/x/y")
    assert kernel_cache.cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/gpubench")
    assert kernel_cache.cache_dir({}) == Path.home() / ".cache" / "gpubench"


def test_the_kernel_cache_key_changes_with_each_thing_the_cubin_depends_on():
    from gpubench.core import kernel_cache

    base = ("90", 13000, "14.2.0", ("13.0.88", None, None))
    keys = {kernel_cache.env_key(*base)}
    for i, other in enumerate(("100", 12080, "14.1.0", (None, None, "12.9.86"))):
        args = list(base)
        args[i] = other
        keys.add(kernel_cache.env_key(*args))
    assert len(keys) == 5 and kernel_cache.env_key(*base) == kernel_cache.env_key(*base)
