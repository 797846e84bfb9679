"""Default plugin: NumPy decode attention on the CPU (split-KV online softmax, as in flash-decoding).

Contiguous and paged caches (see :mod:`kbench.ops.decode`): a paged cache is walked the same way,
each block of ``block_kv`` tokens gathered from its pages through the block table (a block holds
whole pages), so the whole logical cache is never materialised.
"""
from __future__ import annotations

import numpy as np

import kbench
from kbench.backends import Backend, Tunable
from kbench.ops import Case
from kbench.ops.attention import softmax_scale


def cache_blocks(k, v, bi: int, block_kv: int, block_table=None, page_size: int = 0, seqlen_kv: int = 0):
    """``(k0, k1, k_block, v_block)`` over sequence ``bi``'s cache, blocks of (n, heads_kv, head_dim).

    Contiguous: views of ``k[bi, k0:k1]``. Paged (``block_table`` given): ``k`` and ``v`` are the page
    pools; a block is ``max(1, block_kv // page_size)`` whole pages gathered through the block table,
    cut at ``seqlen_kv`` (the rows past it in the last page are not part of the sequence).
    """
    if block_table is None:
        sk = k.shape[1]
        for k0 in range(0, sk, block_kv):
            k1 = min(k0 + block_kv, sk)
            yield k0, k1, k[bi, k0:k1], v[bi, k0:k1]
        return
    per_block = max(1, block_kv // page_size)
    pages = np.asarray(block_table[bi])
    for p0 in range(0, len(pages), per_block):
        k0, k1 = p0 * page_size, min((p0 + per_block) * page_size, seqlen_kv)
        ids = pages[p0:p0 + per_block]
        yield (k0, k1, k[ids].reshape(-1, *k.shape[2:])[:k1 - k0], v[ids].reshape(-1, *v.shape[2:])[:k1 - k0])


def decode_numpy(q, k, v, out, *, scale: float, block_kv: int = 8192, block_table=None, page_size: int = 0,
                 seqlen_kv: int = 0) -> None:
    """Walk the cache in blocks of ``block_kv`` keys with a running max, denominator and accumulator.

    All query heads sharing a KV head, and all query tokens, form one (group*sq, d) matrix, so each
    block of K and V is read from memory once per KV head, by 2-D GEMMs on strided views of the cache
    (BLAS takes the row stride; no copy for float32). Only the last ``sq`` keys can be masked (query
    row i sees keys j <= sk - sq + i); blocks before them need no mask. Compute in float32.
    A paged cache (``block_table``, ``page_size``, ``seqlen_kv``) is read through :func:`cache_blocks`.
    """
    b, sq, hq, d = q.shape
    sk = k.shape[1] if block_table is None else seqlen_kv
    hkv = k.shape[2]
    g = hq // hkv
    offset = sk - sq
    # (b, hkv, g*sq, d), rows ordered (head in group, token)
    qg = (q.astype(np.float32) * np.float32(scale)).reshape(b, sq, hkv, g, d).transpose(0, 2, 3, 1, 4)
    qg = qg.reshape(b, hkv, g * sq, d)
    token = np.tile(np.arange(sq), g)  # query token of each row
    o = np.empty((b, hkv, g * sq, v.shape[-1]), dtype=np.float32)
    rows = g * sq
    for bi in range(b):
        # K_block @ Q^T (the tall cache block as the left operand) is what BLAS streams fastest;
        # the small (n, rows) result is then transposed to rows for the softmax and P V
        q_t = [np.ascontiguousarray(qg[bi, h].T) for h in range(hkv)]    # (d, rows) per KV head
        m = np.full((hkv, rows, 1), -np.inf, dtype=np.float32)
        l = np.zeros_like(m)
        acc = np.zeros((hkv, rows, v.shape[-1]), dtype=np.float32)
        for k0, k1, kraw, vraw in cache_blocks(k, v, bi, block_kv, block_table, page_size, seqlen_kv):
            # one contiguous conversion per block for all heads (bf16/fp16 -> fp32; a view for fp32)
            kblk = kraw.astype(np.float32, copy=False)                     # (n, hkv, d)
            vblk = vraw.astype(np.float32, copy=False)
            visible = None
            if k1 - 1 > offset:  # the block reaches the new tokens: mask the future of each row
                visible = np.arange(k0, k1)[None, :] <= (token + offset)[:, None]
            for h in range(hkv):
                s = np.ascontiguousarray((kblk[:, h] @ q_t[h]).T)          # (rows, n)
                if visible is not None:
                    s = np.where(visible, s, np.float32(-np.inf))
                m_new = np.maximum(m[h], s.max(axis=-1, keepdims=True))
                p = np.exp(s - m_new)
                alpha = np.exp(m[h] - m_new)  # m starts at -inf: exp(-inf) = 0, and every row sees key 0
                l[h] = l[h] * alpha + p.sum(axis=-1, keepdims=True)
                acc[h] = acc[h] * alpha + p @ vblk[:, h]
                m[h] = m_new
        o[bi] = acc / l
    out[...] = o.reshape(b, hkv, g, sq, -1).transpose(0, 3, 1, 2, 4).reshape(b, sq, hq, -1)


class NumpyDecode(Backend):
    name = "numpy-decode"
    op = "decode_attention"
    device = "cpu"
    description = "NumPy split-KV decode (online softmax over cache blocks), float32 compute; contiguous or paged cache"
    tunables = {"block_kv": Tunable(8192, (1024, 2048, 4096, 8192, 16384, 32768, 65536), "cache tokens per block")}
    features = frozenset({"paged"})

    def prepare(self, case: Case):
        scale, block = softmax_scale(case), self.setting("block_kv")
        if case["page_size"]:
            page, sk = case["page_size"], case["seqlen_kv"]

            def run_paged(q, k_pages, v_pages, block_table, out):
                decode_numpy(q, k_pages, v_pages, out, scale=scale, block_kv=block, block_table=block_table,
                             page_size=page, seqlen_kv=sk)
            return run_paged

        def run(q, k, v, out):
            decode_numpy(q, k, v, out, scale=scale, block_kv=block)
        return run

    def info(self):
        return {"numpy": np.__version__}  # the base class adds every tunable's value


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(NumpyDecode())
