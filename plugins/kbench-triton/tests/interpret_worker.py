"""Runs the Triton kernel in Triton's interpreter (CPU) and writes one JSON result per check.

Started by test_interpreter.py as ``TRITON_INTERPRET=1 python interpret_worker.py OUT.json``: the
variable must be set before triton is imported, so these runs live in their own process and the
setting never reaches the pytest process. Each check goes through kbench's own execution path
(poisoned output, two seeds, float64 reference, inputs unchanged) on the ``cpu`` device: the
harness's NumPy arrays become CPU torch tensors through ``kbench.api.as_torch``.

The interpreter computes bf16 wrongly (triton issue 11584), so the checks here use fp32 and fp16;
bf16 is checked on a GPU (docs/triton.md).
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

from kbench.api import Backend, attention_float64, get_plugin_manager
from kbench.testing import ONE_SAMPLE_TIMING, TEST_CHECK, check_backend, kernel_file_backend, make_case
SMALL_TILES = {"BLOCK_M": 16, "BLOCK_N": 16}

#: name -> attention case parameters; tiles of 16 so that every case spans several blocks
CASES = {
    "mha-full-fp32": dict(batch=1, seqlen_q=48, seqlen_kv=48, heads_q=2, heads_kv=2, head_dim=64, causal=False,
                          dtype="fp32"),
    "gqa-causal-sq<sk-ragged-fp32": dict(batch=1, seqlen_q=37, seqlen_kv=53, heads_q=4, heads_kv=2, head_dim=64,
                                         causal=True, dtype="fp32"),
    "mqa-causal-sq>sk-ragged-fp32": dict(batch=2, seqlen_q=53, seqlen_kv=37, heads_q=4, heads_kv=1, head_dim=64,
                                         causal=True, dtype="fp32"),
    "mha-causal-d128-fp16": dict(batch=2, seqlen_q=45, seqlen_kv=45, heads_q=2, heads_kv=2, head_dim=128,
                                 causal=True, dtype="fp16"),
    "gqa-full-d256-sq<sk-fp16": dict(batch=1, seqlen_q=19, seqlen_kv=40, heads_q=2, heads_kv=1, head_dim=256,
                                     causal=False, dtype="fp16"),
    "gqa-full-sq>sk-ragged-fp16": dict(batch=1, seqlen_q=70, seqlen_kv=33, heads_q=6, heads_kv=3, head_dim=64,
                                       causal=False, dtype="fp16"),
    "causal-one-query-row-fp32": dict(batch=1, seqlen_q=1, seqlen_kv=29, heads_q=2, heads_kv=2, head_dim=32,
                                      causal=True, dtype="fp32"),
    "causal-one-key-fp16": dict(batch=1, seqlen_q=40, seqlen_kv=1, heads_q=2, heads_kv=1, head_dim=64, causal=True,
                                dtype="fp16"),
}

#: the Hopper kernel takes 16-bit types only: CASES' fp16 ones, and its fp32 ones in fp16
HOPPER_CASES = {name.replace("fp32", "fp16"): {**params, "dtype": "fp16"} for name, params in CASES.items()}


class OnCpu(Backend):
    """Presents a ``cuda`` backend as a ``cpu`` one: the interpreter runs Triton kernels on CPU tensors."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.name, self.op, self.device = inner, inner.name, inner.op, "cpu"
        self.features = inner.features

    def supports(self, case):
        return self.inner.supports(case)

    def prepare(self, case):
        return self.inner.prepare(case)


def run_check(pm, backend: Backend, params: dict) -> dict:
    case = make_case(pm, **params)
    rec = check_backend(pm, OnCpu(backend), case, device="cpu", timing=ONE_SAMPLE_TIMING, check=TEST_CHECK)
    correctness = rec.get("correctness") or {}
    return {"status": str(rec["status"]), "reason": rec.get("reason") or rec.get("message") or "",
            "rel_l2": correctness.get("rel_l2"), "bound": correctness.get("bound"), "case": case.id,
            "outputs": correctness.get("outputs") or {}}


def run_in_interpreter(worker: Path, out: Path) -> dict:
    """Run ``worker OUT`` in a subprocess with TRITON_INTERPRET=1 (never set in the caller) and read OUT."""
    import subprocess

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(worker), str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"interpreter worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def loop_bound_check(seed_module) -> dict:
    """Causal loop bounds: key blocks wholly in a query block's future must never be read.

    V rows after the first query block's diagonal are NaN. Query rows of the first block see none of
    them; a kernel that visited those key blocks (even fully masked) would multiply p = 0 by NaN.
    """
    import torch

    results = {}
    for sq, sk in ((64, 64), (48, 64), (64, 40)):
        rng = np.random.default_rng(sq * 1000 + sk)
        q, k, v = (torch.from_numpy(rng.standard_normal((1, s, 2, 32), dtype=np.float32)) for s in (sq, sk, sk))
        diagonal = sk - sq
        first_block_sees = max(0, min(sk, 16 + diagonal))  # keys visible to rows 0..15
        v[:, first_block_sees:] = float("nan")
        out = torch.full_like(q, float("nan"))
        seed_module.attention(q, k, v, out, causal=True, scale=32 ** -0.5, BLOCK_M=16, BLOCK_N=16)
        ref = attention_float64(q.numpy(), k.numpy(), np.nan_to_num(v.numpy()), causal=True, scale=32 ** -0.5)
        got = out[:, :16].numpy()
        err = float(np.linalg.norm(got - ref[:, :16]) / max(np.linalg.norm(ref[:, :16]), 1e-30))
        results[f"sq={sq},sk={sk}"] = {"finite": bool(np.isfinite(got).all()), "rel_l2": err}
    return results


def main(out_path: str) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run me with TRITON_INTERPRET=1")
    from kbench_triton.backends import TritonAttention, TritonHopperAttention, hopper_module, kernel_module

    pm = get_plugin_manager()
    seed = kernel_module()
    results: dict[str, dict] = {}

    def guarded(name, fn):
        try:
            results[name] = fn()
        except Exception:  # noqa: BLE001 - report every check, even after one breaks
            results[name] = {"status": "worker-error", "reason": traceback.format_exc()}

    small = TritonAttention(**SMALL_TILES)
    for name, params in CASES.items():
        guarded(f"backend/{name}", lambda p=params: run_check(pm, small, p))
    # the backend as shipped: per-shape configuration from CONFIGS (128-row tiles, one block here)
    guarded("backend-table/gqa-causal", lambda: run_check(pm, TritonAttention(), CASES["gqa-causal-sq<sk-ragged-fp32"]))
    # the seed as a kernel file through the `triton` substrate, as `kbench run -b` and the evolve plugin use it
    seed_file = kernel_file_backend(pm, seed.__file__, **SMALL_TILES)
    for name in ("mqa-causal-sq>sk-ragged-fp32", "mha-causal-d128-fp16"):
        guarded(f"kernel-file/{name}", lambda p=CASES[name]: run_check(pm, seed_file, p))
    guarded("loop-bounds", lambda: loop_bound_check(seed))
    # the Hopper kernel: tensor descriptors (zero-filled past seqlen, clipped stores) in both loop forms;
    # fp16 only (the kernel takes 16-bit types; the interpreter's bf16 is wrong)
    for ws in (1, 0):
        hopper = TritonHopperAttention(**SMALL_TILES, WARP_SPECIALIZE=ws)
        for name, params in HOPPER_CASES.items():
            guarded(f"hopper-ws{ws}/{name}", lambda p=params, b=hopper: run_check(pm, b, p))
    hopper_file = kernel_file_backend(pm, hopper_module().__file__, **{**SMALL_TILES, "BLOCK_N": 32})
    guarded("hopper-kernel-file/gqa-full-sq>sk-ragged-fp16",
            lambda: run_check(pm, hopper_file, CASES["gqa-full-sq>sk-ragged-fp16"]))
    Path(out_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
