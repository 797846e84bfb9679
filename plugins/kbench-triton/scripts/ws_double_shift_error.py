"""The error a double-shifted row index gives under a causal mask, predicted in float64 (docs/triton.md).

Warp specialisation split each 128-row query block between two consumer warpgroups and computed the second
one's rows as start_m + 64 + (64..127): those rows saw up to 64 keys of their future, within the diagonal
block (the loop bound still ended there). This computes, with kbench's standard-normal inputs, the relative
L2 error of that mask against the right one, over every row and over samples of rows as kbench's checks
take them (the first and last row always, the rest at random), to set next to the H200's measured errors.

    python plugins/kbench-triton/scripts/ws_double_shift_error.py      # about 30 s on 2 cores
"""
from __future__ import annotations

import numpy as np


def per_row(sq, sk, hq, hkv, d, batch=1, block=128, seed=0, chunk=1024):
    """Squared error and squared reference norm per (batch, row, head)."""
    rng = np.random.default_rng(seed)
    diag, scale = sk - sq, d ** -0.5
    err, ref = np.zeros((batch, sq, hq)), np.zeros((batch, sq, hq))
    for b in range(batch):
        q = rng.standard_normal((sq, hq, d))
        k, v = rng.standard_normal((sk, hkv, d)), rng.standard_normal((sk, hkv, d))
        for h in range(hq):
            kh, vh = k[:, h // (hq // hkv)], v[:, h // (hq // hkv)]
            for c0 in range(0, sq, chunk):
                rows = np.arange(c0, min(sq, c0 + chunk))
                s = (q[rows, h] @ kh.T) * scale
                j, r = np.arange(sk)[None, :], rows[:, None]
                start = (r // block) * block
                hi = np.minimum(sk, start + block + diag)           # the loop bound of the query block
                shift = np.where(r - start >= block // 2, block // 2, 0)
                outs = []
                for mask in (j <= r + diag, (j <= r + shift + diag) & (j < hi)):
                    masked = np.where(mask, s, -np.inf)
                    m = masked.max(1, keepdims=True)
                    p = np.exp(masked - np.where(np.isfinite(m), m, 0))
                    l = p.sum(1, keepdims=True)
                    outs.append((p @ vh) / np.where(l == 0, 1, l))
                err[b, rows, h] = ((outs[1] - outs[0]) ** 2).sum(1)
                ref[b, rows, h] = (outs[0] ** 2).sum(1)
    return err, ref


def sampled(err, ref, count, trials=2000, seed=1):
    """5th, 50th and 95th percentile of the relative L2 error over ``count``-row samples."""
    rng, n, values = np.random.default_rng(seed), err.shape[1], []
    for _ in range(trials):
        rows = np.unique(np.concatenate([[0, n - 1], rng.choice(np.arange(1, n - 1), count - 2, replace=False)]))
        values.append((err[:, rows].sum() / ref[:, rows].sum()) ** 0.5)
    return np.percentile(values, [5, 50, 95])


if __name__ == "__main__":
    # (seqlen_q, seqlen_kv, heads_q, heads_kv, head_dim), batch, rows a check samples, the H200's measured error
    for shape, batch, count, measured in [((777, 777, 4, 4, 128), 1, 64, 0.117), ((300, 1000, 8, 2, 128), 1, 64, 0.173),
                                          ((1000, 300, 8, 1, 64), 2, 64, 0.588),
                                          ((16384, 16384, 1, 1, 128), 1, 128, 0.099)]:
        e, r = per_row(*shape, batch=batch)
        print(shape, "every row", round(float((e.sum() / r.sum()) ** 0.5), 3), f"{count}-row samples 5/50/95%",
              np.round(sampled(e, r, count), 3), "measured", measured, flush=True)
