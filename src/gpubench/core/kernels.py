"""The CUDA kernels gpubench runs, compiled with NVRTC and kept as cubins (core/kernel_cache.py),
and the launch helpers around them.

- nvbandwidth's copy kernels (kernels.cu ``simpleCopyKernel`` below 64 MiB, ``stridingMemcpyKernel``
  above; ``getAdjustedCopySize`` truncates the copy): SM-driven copies between any two addresses a
  GPU can reach (its memory, a peer's, page-locked host memory).
- nvbandwidth's pointer chase (kernels.cu ``ptrChasingKernel``, testcase.cpp ``latencyHelper``):
  one thread follows ``next`` pointers laid 16 nodes (128 bytes) apart; latency = time / accesses.
- a pattern fill and check on the device (no host copy of the data).
"""

from __future__ import annotations

SM_THREADS_PER_BLOCK = 512  # nvbandwidth common.h numThreadPerBlock
SM_SMALL_BUFFER = 64 * 2**20  # nvbandwidth smallBufferThreshold (64 MiB): below it the simple kernel
LATENCY_STRIDE = 16  # nvbandwidth common.h strideLen: nodes (8 bytes each) between two accesses
LATENCY_NODE_BYTES = 8  # sizeof(struct LatencyNode): one pointer


def sm_copy_geometry(nbytes: int, num_sms: int) -> tuple[str, int, int, int]:
    """How nvbandwidth's copyKernel splits a copy (kernels.cu, memcpy.cpp getAdjustedCopySize):
    (kernel, grid, block, copied_bytes), "simple" below 64 MiB, else "striding" (the copy truncated
    to a multiple of SMs * 512 uint4s); copied_bytes is what the kernel really moves."""
    n16 = nbytes // 16
    if nbytes < SM_SMALL_BUFFER:
        if n16 == 0:
            return "simple", 0, 0, 0
        block = min(n16, 1024)
        grid = n16 // block
        return "simple", grid, block, grid * block * 16
    total = num_sms * SM_THREADS_PER_BLOCK
    elems = total * (n16 // total)
    return "striding", num_sms, SM_THREADS_PER_BLOCK, elems * 16


_KERNELS_SRC = r"""
__device__ __forceinline__ uint4 gb_ldcg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void gb_stcg(uint4* p, uint4 v) {
    asm volatile("st.global.cg.v4.u32 [%0], {%1,%2,%3,%4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
// nvbandwidth kernels.cu simpleCopyKernel (__ldcg/__stcg written as PTX for NVRTC)
extern "C" __global__ void gb_simple_copy(unsigned long long loopCount, uint4* dst, const uint4* src) {
    for (unsigned int i = 0; i < loopCount; i++) {
        const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        gb_stcg(dst + idx, gb_ldcg(src + idx));
    }
}
// nvbandwidth kernels.cu stridingMemcpyKernel
extern "C" __global__ void gb_striding_copy(unsigned int totalThreadCount, unsigned long long loopCount,
                                            uint4* dst, const uint4* src, unsigned long long chunkSizeInElement) {
    unsigned long long from = blockDim.x * blockIdx.x + threadIdx.x;
    unsigned long long bigChunkSizeInElement = chunkSizeInElement / 12;
    dst += from;
    src += from;
    uint4* dstBigEnd = dst + (bigChunkSizeInElement * 12) * totalThreadCount;
    uint4* dstEnd = dst + chunkSizeInElement * totalThreadCount;
    for (unsigned int i = 0; i < loopCount; i++) {
        uint4* cdst = dst;
        const uint4* csrc = src;
        while (cdst < dstBigEnd) {
            uint4 p0 = *csrc; csrc += totalThreadCount;
            uint4 p1 = *csrc; csrc += totalThreadCount;
            uint4 p2 = *csrc; csrc += totalThreadCount;
            uint4 p3 = *csrc; csrc += totalThreadCount;
            uint4 p4 = *csrc; csrc += totalThreadCount;
            uint4 p5 = *csrc; csrc += totalThreadCount;
            uint4 p6 = *csrc; csrc += totalThreadCount;
            uint4 p7 = *csrc; csrc += totalThreadCount;
            uint4 p8 = *csrc; csrc += totalThreadCount;
            uint4 p9 = *csrc; csrc += totalThreadCount;
            uint4 p10 = *csrc; csrc += totalThreadCount;
            uint4 p11 = *csrc; csrc += totalThreadCount;
            *cdst = p0; cdst += totalThreadCount;
            *cdst = p1; cdst += totalThreadCount;
            *cdst = p2; cdst += totalThreadCount;
            *cdst = p3; cdst += totalThreadCount;
            *cdst = p4; cdst += totalThreadCount;
            *cdst = p5; cdst += totalThreadCount;
            *cdst = p6; cdst += totalThreadCount;
            *cdst = p7; cdst += totalThreadCount;
            *cdst = p8; cdst += totalThreadCount;
            *cdst = p9; cdst += totalThreadCount;
            *cdst = p10; cdst += totalThreadCount;
            *cdst = p11; cdst += totalThreadCount;
        }
        while (cdst < dstEnd) {
            *cdst = *csrc; cdst += totalThreadCount; csrc += totalThreadCount;
        }
    }
}
// nvbandwidth kernels.cu ptrChasingKernel: only block targetBlock chases (the others return)
struct gb_node { gb_node* next; };
extern "C" __global__ void gb_ptr_chase(gb_node* data, unsigned int accesses, unsigned int targetBlock) {
    gb_node* p = data;
    if (blockIdx.x != targetBlock) return;
    for (unsigned int i = 0; i < accesses; ++i) p = p->next;
    if (p == nullptr) __trap();  // keeps the loads (nvbandwidth's guard against the optimiser)
}
__device__ __forceinline__ unsigned char gb_pattern(unsigned long long i, unsigned int seed) {
    unsigned int x = (unsigned int)i * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    return (unsigned char)x;
}
extern "C" __global__ void gb_fill(unsigned char* p, unsigned long long n, unsigned int seed) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = gb_pattern(i, seed);
}
extern "C" __global__ void gb_count_wrong(const unsigned char* p, unsigned long long n, unsigned int seed,
                                          unsigned long long* wrong) {
    unsigned long long bad = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        bad += (p[i] != gb_pattern(i, seed));
    if (bad) atomicAdd(wrong, bad);
}
"""
_modules: dict[int, object] = {}


def module():
    """The kernels above as a cupy.RawModule for the current device (loaded once per device)."""
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _modules:
        from gpubench.core import kernel_cache

        _modules[dev] = kernel_cache.load(_KERNELS_SRC)
    return _modules[dev]


def num_sms(device: int) -> int:
    from cupy.cuda import runtime

    return runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device)


def fill(device: int, ptr: int, nbytes: int, seed: int) -> None:
    import cupy
    import numpy as np

    with cupy.cuda.Device(device):
        k = module().get_function("gb_fill")
        k((num_sms(device) * 4,), (256,), (np.uint64(ptr), np.uint64(nbytes), np.uint32(seed)))
        cupy.cuda.Device().synchronize()


def count_wrong(device: int, ptr: int, nbytes: int, seed: int) -> int:
    import cupy
    import numpy as np

    with cupy.cuda.Device(device):
        wrong = cupy.zeros(1, dtype=cupy.uint64)
        k = module().get_function("gb_count_wrong")
        k((num_sms(device) * 4,), (256,), (np.uint64(ptr), np.uint64(nbytes), np.uint32(seed), wrong))
        return int(wrong.get()[0])


def sm_copy_enqueue(device: int, dst_ptr: int, src_ptr: int, nbytes: int):
    """nvbandwidth's copy kernel (copyKernel) from ``src_ptr`` to ``dst_ptr``, run on ``device``:
    (enqueue(stream, k), one launch looping k times over the copy; bytes one pass really moves)."""
    import numpy as np

    sms = num_sms(device)
    kind, grid, block, copied = sm_copy_geometry(nbytes, sms)
    import cupy

    with cupy.cuda.Device(device):
        mod = module()
        if kind == "simple":
            fn = mod.get_function("gb_simple_copy")

            def enqueue(stream, k):
                fn((grid,), (block,), (np.uint64(k), np.uint64(dst_ptr), np.uint64(src_ptr)), stream=stream)
        else:
            fn = mod.get_function("gb_striding_copy")
            total = grid * block
            chunk = copied // 16 // total

            def enqueue(stream, k):
                fn((grid,), (block,), (np.uint32(total), np.uint64(k), np.uint64(dst_ptr), np.uint64(src_ptr),
                                       np.uint64(chunk)), stream=stream)
    return enqueue, copied


def chase_layout(host_array) -> int:
    """Lay nvbandwidth's pointer chain into a page-locked host buffer (a uint8 numpy array over it): node i points to
    node (i + 16) mod n, by host address; returns n (bytes // 8). Raises ValueError: the buffer holds fewer than one
    node."""
    import numpy as np

    n = len(host_array) // LATENCY_NODE_BYTES
    if n < 1:
        raise ValueError("the latency buffer must hold at least one 8-byte node")
    nodes = host_array[: n * LATENCY_NODE_BYTES].view(np.uint64)
    base = np.uint64(host_array.ctypes.data)
    # 2**20 nodes (8 MiB) per chunk, so the layout's temporary stays 8 MiB at any buffer size
    step = 1 << 20
    for lo in range(0, n, step):
        idx = np.arange(lo, min(n, lo + step), dtype=np.uint64)
        idx += np.uint64(LATENCY_STRIDE)
        idx %= np.uint64(n)
        idx *= np.uint64(LATENCY_NODE_BYTES)
        idx += base
        nodes[lo:lo + len(idx)] = idx
    return n


def ptr_chase_enqueue(device: int, ptr: int):
    """``enqueue(stream, accesses, target_block)``: one launch of nvbandwidth's pointer chase from
    ``ptr`` on ``device`` (grid = the SM count, one thread per block, only ``target_block`` runs)."""
    import cupy
    import numpy as np

    with cupy.cuda.Device(device):
        fn = module().get_function("gb_ptr_chase")
        grid = num_sms(device)

    def enqueue(stream, accesses: int, target_block: int) -> None:
        fn((grid,), (1,), (np.uint64(ptr), np.uint32(accesses), np.uint32(target_block % grid)), stream=stream)

    return enqueue
