"""NumPy seed of an evolve lineage: tiled attention with an online softmax (float32), CPU.

The starting genome of ``kbench evolve`` on the CPU. Correct on every attention case (MHA, GQA,
causal with bottom-right alignment, ragged lengths, fp32/fp16/bf16 inputs); its TUNABLES defaults
are sensible but deliberately NOT tuned for any machine, so there is room for the search to find
better ones (and, for the LLM operators, better code).
"""
import numpy as np

SUBSTRATE = "numpy"
OP = "attention"
TUNABLES = {
    "block_q": {"default": 32, "choices": [16, 32, 64, 128, 256, 512, 1024],
                "help": "query rows per tile"},
    "block_k": {"default": 32, "choices": [16, 32, 64, 128, 256, 512, 1024],
                "help": "key rows per tile"},
}


def attention(q, k, v, out, *, causal, scale, block_q=32, block_k=32):
    batch, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    # heads sharing a KV head are stacked as extra query rows: (b, hkv, group, sq, d)
    qh = q.astype(np.float32).reshape(batch, sq, hkv, group, d).transpose(0, 2, 3, 1, 4)
    kh = k.astype(np.float32).transpose(0, 2, 1, 3)[:, :, None]   # (b, hkv, 1, sk, d)
    vh = v.astype(np.float32).transpose(0, 2, 1, 3)[:, :, None]   # (b, hkv, 1, sk, dv)
    shift = sk - sq  # query row i sees key j when j <= i + shift
    res = np.zeros((batch, hkv, group, sq, dv), dtype=np.float32)
    for i0 in range(0, sq, block_q):
        i1 = min(i0 + block_q, sq)
        qi = qh[:, :, :, i0:i1] * np.float32(scale)
        row_max = np.full(qi.shape[:-1] + (1,), -np.inf, dtype=np.float32)
        row_sum = np.zeros_like(row_max)
        acc = np.zeros(qi.shape[:-1] + (dv,), dtype=np.float32)
        last = min(sk, i1 + shift) if causal else sk
        for j0 in range(0, max(last, 0), block_k):
            j1 = min(j0 + block_k, sk)
            s = qi @ kh[:, :, :, j0:j1].swapaxes(-1, -2)
            if causal and j1 - 1 > i0 + shift:
                seen = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + shift
                s = np.where(seen, s, -np.inf)
            new_max = np.maximum(row_max, s.max(axis=-1, keepdims=True))
            safe = np.where(np.isneginf(new_max), 0.0, new_max).astype(np.float32)
            p = np.exp(s - safe)
            corr = np.exp(np.where(np.isneginf(row_max), safe, row_max) - safe)
            row_sum = row_sum * corr + p.sum(axis=-1, keepdims=True)
            acc = acc * corr + p @ vh[:, :, :, j0:j1]
            row_max = new_max
        res[:, :, :, i0:i1] = acc / np.where(row_sum == 0, 1.0, row_sum)
    out[...] = res.transpose(0, 3, 1, 2, 4).reshape(batch, sq, hq, dv)
