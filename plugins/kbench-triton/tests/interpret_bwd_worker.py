"""Runs the Triton backward in Triton's interpreter (CPU) and writes one JSON result per check.

Started by test_triton_backward.py as ``TRITON_INTERPRET=1 python interpret_bwd_worker.py OUT.json`` (the
variable must be set before triton is imported; see interpret_worker.py). The reference is torch
autograd in float64 through a dense softmax (independent of kbench's own reference and of the
kernels): out, dq, dk, dv are each compared by relative L2 error. fp32 and fp16 only: the interpreter
computes bf16 wrongly (triton issue 11584), bf16 is checked on a GPU (test_gpu.py).
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

#: tiles of 16 so that every case spans several blocks in both passes
TINY = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
TINY_BWD = {"dkdv": TINY, "dq": TINY}

#: name -> (batch, seqlen_q, seqlen_kv, heads_q, heads_kv, head_dim, causal, dtype)
CASES = {
    "mha-full-fp32": (1, 48, 48, 2, 2, 32, False, "float32"),
    "gqa-causal-sq<sk-ragged-fp32": (1, 37, 53, 4, 2, 16, True, "float32"),
    "mqa-causal-sq>sk-ragged-fp32": (2, 53, 37, 2, 1, 16, True, "float32"),   # 16 rows see no key
    "mha-causal-ragged-fp16": (1, 45, 45, 2, 2, 32, True, "float16"),
    "gqa-full-sq>sk-ragged-fp16": (1, 70, 33, 4, 2, 16, False, "float16"),
    "gqa-causal-sq<sk-fp16": (1, 32, 80, 4, 1, 32, True, "float16"),
    "causal-three-keys-fp32": (1, 20, 3, 2, 1, 16, True, "float32"),     # 17 rows see no key
}
#: the shipped tiles (bwd_config/config_for: larger than these sequences, one block per pass)
SHIPPED_CASES = {"shipped-gqa-causal-fp32": (1, 37, 53, 4, 2, 64, True, "float32"),
                 "shipped-mha-full-fp16": (1, 40, 40, 2, 2, 32, False, "float16")}
TOLERANCE = {"float32": 1e-5, "float16": 2e-3}


def reference(q, k, v, do, *, causal: bool, scale: float):
    """out, dq, dk, dv by torch autograd in float64 (dense scores; rows that see no key output 0)."""
    import torch

    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        hidden = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(hidden, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)   # a fully masked row: NaN softmax, 0 by the op's definition
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    out.backward(do.double())
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def rel_l2(got, ref) -> float:
    got = got.double()
    if not bool(got.isfinite().all()):
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def inputs(shape, seed: int):
    import torch

    b, sq, sk, hq, hkv, d, _, dtype = shape
    rng = np.random.default_rng(seed)
    dt = getattr(torch, dtype)
    return [torch.from_numpy(rng.standard_normal(s, dtype=np.float32)).to(dt)
            for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d), (b, sq, hq, d))]


def gradient_check(shape, *, fwd_config=None, bwd_config=None, seed: int = 0) -> dict:
    """Forward (saving the log-sum-exp) then backward into NaN-filled buffers, against float64 autograd."""
    import torch

    from kbench_triton import backward as bwd

    q, k, v, do = inputs(shape, seed)
    causal, d = shape[6], shape[5]
    scale = d ** -0.5
    out = torch.full_like(q, float("nan"))
    lse = bwd.forward(q, k, v, out, causal=causal, scale=scale, config=fwd_config)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd.backward(q, k, v, out, lse, do, dq, dk, dv, causal=causal, scale=scale, config=bwd_config)
    ref = reference(q, k, v, do, causal=causal, scale=scale)
    got = {"out": out, "dq": dq, "dk": dk, "dv": dv}
    return {"rel_l2": {n: rel_l2(got[n], ref[n]) for n in got}, "bound": TOLERANCE[shape[7]]}


def training_kernel_check(shape) -> dict:
    """The backend's TrainingKernel on NumPy arrays (the harness's ``cpu`` arrays): mode bwd (forward,
    then backward with out copied from the saved forward) and mode fwd_bwd (one call)."""
    import torch

    from kbench_triton.backward import TritonTraining, bwd_config

    b, sq, sk, hq, hkv, d, causal, dtype = shape
    name = {"float32": "fp32", "float16": "fp16"}[dtype]
    q, k, v, do = inputs(shape, 1)
    ref = reference(q, k, v, do, causal=causal, scale=d ** -0.5)
    kernel = TritonTraining(causal=causal, scale=d ** -0.5, dtype=_dtype(name), fwd_config=TINY,
                            bwd_config=bwd_config(d, name))
    results = {}
    for mode in ("bwd", "fwd_bwd"):
        arrays = {n: t.numpy() for n, t in zip(("q", "k", "v", "do"), (q, k, v, do))}
        outs = {n: np.full(a.shape, np.nan, a.dtype) for n, a in (("out", arrays["q"]), ("dq", arrays["q"]),
                                                                   ("dk", arrays["k"]), ("dv", arrays["v"]))}
        if mode == "bwd":
            saved = kernel.forward(arrays["q"], arrays["k"], arrays["v"])
            kernel.backward(saved, arrays["do"], *outs.values())
        else:
            kernel(**arrays, **outs)
        results[mode] = {n: rel_l2(torch.from_numpy(a), ref[n]) for n, a in outs.items()}
    return {"rel_l2": results, "bound": TOLERANCE[dtype]}


def _dtype(name: str):
    from kbench.api import DType

    return DType(name)


def loop_bound_check(causal_shape) -> dict:
    """Causal loop bounds of both passes: blocks wholly in the causal future are never read.

    dQ pass: K and V rows after the first query block's last visible key are NaN; the first block's
    dQ must stay finite and right. dK/dV pass: Q and dO rows before the first row that sees the last
    key block are NaN; that key block's dK and dV must stay finite and right. A pass that visited the
    skipped blocks, even fully masked, would multiply a 0 by NaN.
    """
    import torch

    from kbench_triton import backward as bwd

    b, sq, sk, hq, hkv, d, causal, dtype = causal_shape
    q, k, v, do = inputs(causal_shape, 2)
    scale = d ** -0.5
    ref = reference(q, k, v, do, causal=True, scale=scale)
    out = torch.empty_like(q)
    lse = bwd.forward(q, k, v, out, causal=True, scale=scale, config=TINY)
    diagonal = sk - sq
    results = {}

    seen_by_first = max(0, min(sk, 16 + diagonal))    # keys visible to query rows 0..15
    kn, vn = k.clone(), v.clone()
    kn[:, seen_by_first:], vn[:, seen_by_first:] = float("nan"), float("nan")
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    bwd.backward(q, kn, vn, out, lse, do, dq, dk, dv, causal=True, scale=scale, config=TINY_BWD)
    results["dq-first-block"] = rel_l2(dq[:, :16], ref["dq"][:, :16])

    last = (sk - 1) // 16 * 16                         # the last key block's first key
    first_viewer = max(0, last - diagonal) // 16 * 16  # the first query block that sees it
    qn, don = q.clone(), do.clone()
    qn[:, :first_viewer], don[:, :first_viewer] = float("nan"), float("nan")
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    bwd.backward(qn, k, v, out, lse, don, dq, dk, dv, causal=True, scale=scale, config=TINY_BWD)
    results["dk-last-block"] = rel_l2(dk[:, last:], ref["dk"][:, last:])
    results["dv-last-block"] = rel_l2(dv[:, last:], ref["dv"][:, last:])
    return results


#: cases through kbench's own execution path (attention op, mode bwd / fwd_bwd: poisoned outputs, two
#: seeds, the op's float64 gradient reference, each output with its own bound)
KBENCH_CASES = {
    "gqa-causal-sq<sk-ragged-fp32": dict(batch=1, seqlen_q=37, seqlen_kv=53, heads_q=4, heads_kv=2, head_dim=32,
                                         causal=True, dtype="fp32"),
    "mqa-causal-sq>sk-ragged-fp16": dict(batch=1, seqlen_q=45, seqlen_kv=29, heads_q=2, heads_kv=1, head_dim=16,
                                         causal=True, dtype="fp16"),
    "mha-full-ragged-fp16": dict(batch=2, seqlen_q=33, seqlen_kv=33, heads_q=2, heads_kv=2, head_dim=32,
                                 causal=False, dtype="fp16"),
}
KERNEL_FILE = Path(__file__).with_name("bwd_kernel_file.py")


def main(out_path: str) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run me with TRITON_INTERPRET=1")
    results: dict[str, dict] = {}

    def guarded(name, fn):
        try:
            results[name] = fn()
        except Exception:  # noqa: BLE001 - report every check, even after one breaks
            results[name] = {"error": traceback.format_exc()}

    for name, shape in CASES.items():
        guarded(f"grad/{name}", lambda s=shape: gradient_check(s, fwd_config=TINY, bwd_config=TINY_BWD))
    for name, shape in SHIPPED_CASES.items():
        guarded(f"grad/{name}", lambda s=shape: gradient_check(s))
    guarded("training-kernel/gqa-causal-fp16", lambda: training_kernel_check((1, 29, 41, 4, 2, 16, True, "float16")))
    for name in ("gqa-causal-sq<sk-ragged-fp32", "mqa-causal-sq>sk-ragged-fp32"):
        guarded(f"loop-bounds/{name}", lambda s=CASES[name]: loop_bound_check(s))
    from interpret_worker import run_check

    from kbench.api import get_plugin_manager
    from kbench.testing import kernel_file_backend
    from kbench_triton.backends import TritonAttention

    pm = get_plugin_manager()
    backend = TritonAttention(BLOCK_M=16, BLOCK_N=16)   # the forward's tiles; the backward's from bwd_config
    for name, params in KBENCH_CASES.items():
        for mode in ("bwd", "fwd_bwd"):
            guarded(f"kbench/{mode}/{name}", lambda p={**params, "mode": mode}: run_check(pm, backend, p))
    case = {**KBENCH_CASES["gqa-causal-sq<sk-ragged-fp32"], "mode": "bwd"}
    for broken in (0, 1):
        guarded(f"kernel-file/break-dk={broken}", lambda b=broken: run_check(
            pm, kernel_file_backend(pm, KERNEL_FILE, BREAK_DK=b), case))
    Path(out_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
