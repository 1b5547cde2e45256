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
