"""Random inputs fast enough for GPU-sized cases.

The judge gives every timed call input content never seen before, drawn on the trusted side from the
run's secret. For a 16k-token attention case that is 3 x 33.5M values per call; NumPy's normal
generator plus a cast to bfloat16 takes about 3 s for each tensor on a development VM, which made a
GPU check spend more time drawing inputs than measuring (first H200 run: 5-17 s per record).

:func:`standard_normal` keeps NumPy's generator for small arrays (every correctness case) and, past
:data:`POOLED_ABOVE` elements, draws a pool of :data:`POOL_SIZE` normal values in the target dtype and
fills the array with pool entries picked by uniform random 16-bit indices: the same distribution up to
the pool's discreteness (65,536 distinct values of a normal). Chunks of :data:`CHUNK` elements are
filled in parallel threads, each from its own generator seeded by the caller's. ``python -m
kbench.ops.sampling`` on the 2-core development VM (busy): 33.5M bfloat16 values in 0.52 s against 2.80 s
for NumPy's normal plus the cast (5.4x), fp16 3.5x, fp32 3.1x; more cores fill chunks in parallel.
Pool, chunk seeds and indices all come from the caller's generator, so the content is unpredictable to
anyone without the seed and the same on every machine for the same seed.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

#: arrays with more elements than this are filled from a pool (correctness cases stay below it)
POOLED_ABOVE = 1 << 20
#: distinct values in the pool: every 16-bit index is valid, so no rejection sampling is needed
POOL_SIZE = 1 << 16

#: elements per independently seeded chunk: fixed, so the content depends on the seed alone, never on
#: how many threads filled it (published input secrets must regenerate the same inputs anywhere)
CHUNK = 1 << 22

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_POOL: ThreadPoolExecutor | None = None


def _threads() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1)),
                                   thread_name_prefix="kbench-inputs")
    return _POOL


def standard_normal(rng: np.random.Generator, shape: Sequence[int] | int, dtype) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` holding standard-normal values drawn from ``rng``."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    if size <= POOLED_ABOVE or dtype.itemsize not in _UINT:
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    # index the raw bits: fancy indexing of a plain unsigned view is fast for every dtype (bfloat16 too)
    pool = rng.standard_normal(POOL_SIZE, dtype=np.float32).astype(dtype).view(_UINT[dtype.itemsize])
    out = np.empty(size, dtype=pool.dtype)
    starts = range(0, size, CHUNK)
    seeds = rng.integers(0, 2 ** 63, len(starts), dtype=np.int64)

    def fill(i: int) -> None:
        lo = starts[i]
        hi = min(size, lo + CHUNK)
        index = np.random.Generator(np.random.PCG64(int(seeds[i]))).integers(0, POOL_SIZE, hi - lo, dtype=np.uint16)
        np.take(pool, index, out=out[lo:hi])  # the generator and take release the GIL: chunks run in parallel

    list(_threads().map(fill, range(len(starts))))
    return out.view(dtype).reshape(shape)


def _benchmark() -> None:  # pragma: no cover - a figure for the docs, not a test
    import ml_dtypes

    shape = (1, 16384, 16, 128)
    for label, dt in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16), ("float32", np.float32)):
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        rng.standard_normal(shape, dtype=np.float32).astype(dt)
        t1 = time.perf_counter()
        standard_normal(rng, shape, dt)
        t2 = time.perf_counter()
        print(f"{label:9s} {shape}: numpy normal+cast {t1 - t0:.3f} s, pooled {t2 - t1:.3f} s, "
              f"{(t1 - t0) / (t2 - t1):.1f}x")


if __name__ == "__main__":  # pragma: no cover
    _benchmark()
