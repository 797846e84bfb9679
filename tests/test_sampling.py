"""kbench.ops.sampling: fast normal inputs for GPU-sized cases (pooled, chunked, deterministic)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from scipy import stats

from kbench.ops import sampling
from kbench.ops.sampling import POOLED_ABOVE, standard_normal

LARGE = (2, 1024, 4, 160)  # 1.3M elements: above POOLED_ABOVE, in more than one chunk when CHUNK is small


def test_small_arrays_are_numpys_own_draw():
    shape = (2, 8, 3)
    got = standard_normal(np.random.default_rng(3), shape, np.float16)
    want = np.random.default_rng(3).standard_normal(shape, dtype=np.float32).astype(np.float16)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_large_arrays_are_standard_normal(dtype):
    assert np.prod(LARGE) > POOLED_ABOVE
    x = standard_normal(np.random.default_rng(11), LARGE, dtype)
    assert x.shape == LARGE and x.dtype == np.dtype(dtype)
    flat = x.astype(np.float64).ravel()
    assert abs(flat.mean()) < 0.01 and abs(flat.std() - 1.0) < 0.01
    # a Kolmogorov-Smirnov test against N(0, 1) on a subsample: a wrong distribution (uniform, a pool of
    # few values, a shifted or scaled draw) fails it by far
    sub = np.random.default_rng(0).choice(flat, 20000, replace=False)
    assert stats.kstest(sub, "norm").pvalue > 1e-4


def test_same_seed_same_content_whatever_the_threads(monkeypatch):
    a = standard_normal(np.random.default_rng(7), LARGE, ml_dtypes.bfloat16)
    monkeypatch.setattr(sampling, "_POOL", None)
    monkeypatch.setattr(sampling.os, "cpu_count", lambda: 1)  # one filling thread
    b = standard_normal(np.random.default_rng(7), LARGE, ml_dtypes.bfloat16)
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


def test_seeds_and_chunks_give_new_content(monkeypatch):
    monkeypatch.setattr(sampling, "CHUNK", 1 << 18)  # several chunks: each must be drawn independently
    a = standard_normal(np.random.default_rng(1), LARGE, np.float16).ravel()
    b = standard_normal(np.random.default_rng(2), LARGE, np.float16).ravel()
    assert np.mean(a == b) < 0.01
    chunk = 1 << 18
    assert np.mean(a[:chunk] == a[chunk:2 * chunk]) < 0.01
