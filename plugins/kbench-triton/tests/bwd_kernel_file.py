"""A ``triton`` kernel file with a backward (FEATURES bwd, fwd_bwd), for the interpreter tests.

It calls the ``triton`` backend's kernels (``kbench_triton.backward``), so the test exercises the
substrate's ``adapt_training`` (harness arrays -> torch views) and kbench's per-gradient checks.
``BREAK_DK`` is a test hook, not a tunable: 1 scales dK by 1.01, a wrong gradient the check must name.
"""
from kbench_triton import backward as bwd

SUBSTRATE = "triton"
OP = "attention"
FEATURES = ["bwd", "fwd_bwd"]
TUNABLES = {"BREAK_DK": {"default": 0, "choices": [0, 1]}}
TILES = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def attention(q, k, v, out, *, causal, scale, BREAK_DK=0):
    bwd.forward(q, k, v, out, causal=causal, scale=scale, config=TILES)


def attention_forward(q, k, v, *, causal, scale, BREAK_DK=0):
    out = q.new_empty(q.shape)
    return q, k, v, out, bwd.forward(q, k, v, out, causal=causal, scale=scale, config=TILES)


def attention_backward(saved, do, out, dq, dk, dv, *, causal, scale, BREAK_DK=0):
    q, k, v, o, lse = saved
    out.copy_(o)
    bwd.backward(q, k, v, o, lse, do, dq, dk, dv, causal=causal, scale=scale, config={"dkdv": TILES, "dq": TILES})
    if BREAK_DK:
        dk.mul_(1.01)
