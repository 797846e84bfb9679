"""Inputs generated on the GPU: the counter-based generator of kbench.ops.inputs as CUDA kernels.

One thread draws one Philox4x64-10 block (16 elements) and gathers their values from the input's value
table, which lives on the GPU. The source is :func:`kbench.ops.inputs.philox_source` (the same Philox
NumPy runs on the host) plus :data:`FILL`, a ``__host__ __device__`` block routine; the test suite compiles
both as plain C++ and compares them with NumPy's, so the kernel draws exactly the judge's values.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from kbench.api import philox_source

#: elements per thread (one Philox block)
ELEMENTS_PER_THREAD = 16
THREADS = 256

FILL = r"""
/* elements [16 * block, 16 * block + 16) of input `stream` (those below n), gathered from `table` */
template <typename T>
KB_FN void kb_fill_block(T* out, const T* table, u64 n, u64 block, u64 stream, u64 k0, u64 k1) {
    u64 words[4];
    kb_philox(block + 1, stream, k0, k1, words);
    u64 first = block * 16;
    for (int j = 0; j < 16; ++j) {
        u64 e = first + (u64)j;
        if (e >= n) break;
        out[e] = table[(words[j / 4] >> (16 * (j % 4))) & 0xFFFFULL];
    }
}
"""

KERNEL = r"""
extern "C" __global__ void kb_generate_{name}(T* out, const T* table, u64 n, u64 stream, u64 k0, u64 k1) {{
    u64 block = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (block * 16 < n) kb_fill_block<T>(out, table, n, block, stream, k0, k1);
}}
"""

#: element width in bytes -> the unsigned type that carries it
WIDTHS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def device_source() -> str:
    """The whole CUDA source of the generation kernels, one per element width."""
    kernels = "".join(f"#define T {t}\n" + KERNEL.format(name=f"u{8 * w}") + "#undef T\n" for w, t in WIDTHS.items())
    return philox_source() + FILL + kernels


@lru_cache(maxsize=None)
def _module(cp_id: int):
    import cupy as cp

    return cp.RawModule(code=device_source(), options=("-std=c++14",))


def generate_on_device(cp, array: Any, table: Any, key: tuple[int, int], stream: int) -> None:
    """Fill the C-contiguous CuPy ``array`` in place with input ``stream`` for ``key`` from the GPU ``table``."""
    if not array.flags.c_contiguous:
        raise ValueError("inputs are generated into C-contiguous arrays")
    width = array.dtype.itemsize
    if table.dtype.itemsize != width:
        raise ValueError(f"a table of {table.dtype.itemsize}-byte values for a {width}-byte array")
    unsigned = {1: cp.uint8, 2: cp.uint16, 4: cp.uint32, 8: cp.uint64}[width]
    out = array.reshape(-1).view(unsigned)
    n = out.size
    if n == 0:
        return
    kernel = _module(id(cp)).get_function(f"kb_generate_u{8 * width}")
    blocks = -(-n // ELEMENTS_PER_THREAD)
    grid = (-(-blocks // THREADS),)
    kernel(grid, (THREADS,), (out, table.view(unsigned), cp.uint64(n), cp.uint64(stream),
                              cp.uint64(key[0]), cp.uint64(key[1])))
