"""Torch seed of an evolve lineage on the CPU: attention from torch matrix products, no fused attention call.

``SUBSTRATE = "torch"`` (the kbench-torch plugin): the function receives torch CPU tensors that
share memory with the harness's arrays. Fused attention (``scaled_dot_product_attention`` and
friends) is refused by the harness's static policy, so this builds attention from ``matmul``,
reductions and elementwise operations, one block of query rows at a time: the scores of a block
are ``block_q x seqlen_kv`` per head (cache-sized for small blocks), keys in the causal future of
the whole block are never computed, and only the keys beside the diagonal are masked. Correct on
every attention case (MHA, GQA, causal aligned bottom-right, ragged lengths, fp32/fp16/bf16
inputs, computed in float32). The TUNABLES defaults are deliberately not tuned for any machine.
"""
import math

import torch

SUBSTRATE = "torch"
OP = "attention"
TUNABLES = {
    "block_q": {"default": 32, "choices": [16, 32, 64, 128, 256, 512, 1024],
                "help": "query rows per block (scores held: heads_per_call x block_q x seqlen_kv)"},
    "heads_per_call": {"default": 1, "choices": [1, 2, 4, 8],
                       "help": "query heads of one KV head multiplied in one call (capped by the group)"},
    "softmax": {"default": "fused", "choices": ["fused", "exp2"],
                "help": "fused: torch.softmax then P@V; exp2: log2(e) folded into Q, exp2 in place, "
                        "normalise the block's output instead of the probabilities"},
}

LOG2E = 1.4426950408889634


def attention(q, k, v, out, *, causal, scale, block_q=32, heads_per_call=1, softmax="fused"):
    batch, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    per_call = max(1, min(heads_per_call, group))
    f32 = torch.float32
    factor = scale * (LOG2E if softmax == "exp2" else 1.0)
    # one contiguous copy of each input in the layout the products want
    qh = (q.to(f32) * factor).permute(0, 2, 1, 3).reshape(batch, hkv, group, sq, d).contiguous()
    kt = k.to(f32).permute(0, 2, 3, 1).contiguous()            # (b, hkv, d, sk)
    vh = v.to(f32).permute(0, 2, 1, 3).contiguous()            # (b, hkv, sk, dv)
    res = out.view(batch, sq, hkv, group, dv)
    shift = sk - sq  # query row i sees key j when j <= i + shift
    first_row = max(0, -shift) if causal else 0  # rows before it see no key: zeros by definition
    if first_row:
        res[:, :first_row].zero_()
    for i0 in range(first_row, sq, block_q):
        i1 = min(i0 + block_q, sq)
        last = min(sk, i1 + shift) if causal else sk        # keys beyond it are in every row's future
        start = max(0, i0 + shift + 1) if causal else last   # keys from here on need the mask
        mask = None
        if start < last:
            mask = torch.arange(start, last)[None, :] > (torch.arange(i0, i1) + shift)[:, None]
        for bi in range(batch):
            for g in range(hkv):
                for h0 in range(0, group, per_call):
                    h1 = min(h0 + per_call, group)
                    s = torch.matmul(qh[bi, g, h0:h1, i0:i1], kt[bi, g, :, :last])
                    if mask is not None:
                        s[:, :, start:last].masked_fill_(mask, -math.inf)
                    if softmax == "exp2":
                        s.sub_(s.amax(dim=-1, keepdim=True)).exp2_()
                        o = torch.matmul(s, vh[bi, g, :last]).div_(s.sum(dim=-1, keepdim=True))
                    else:
                        o = torch.matmul(torch.softmax(s, dim=-1), vh[bi, g, :last])
                    res[bi, i0:i1, g, h0:h1] = o.transpose(0, 1)
