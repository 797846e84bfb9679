"""The judge's warm-up calls get real inputs in every slot, never the arena's untouched zeros."""
from __future__ import annotations

import dataclasses

import numpy as np

from kbench.ops.attention import attention_float64
from kbench.testing import TEST_TIMING


def test_warmup_never_hands_a_kernel_an_unwritten_slot(kbench_case, kbench_check, fake_backend):
    seen_zero = []

    def kernel(q, k, v, out, case):
        if not np.any(q) or not np.any(k):  # an unwritten arena slot: zeros everywhere
            seen_zero.append(True)
            raise ValueError("called on an all-zero input set")
        out[...] = attention_float64(q, k, v, causal=case["causal"], scale=1 / np.sqrt(case["head_dim"]))

    # a fast kernel: the judge batches several calls, more slots than the correctness check filled
    # and a warm-up time, so warm-up batches are whole batches
    timing = dataclasses.replace(TEST_TIMING, warmup_time=0.05)
    rec = kbench_check(fake_backend(kernel, name="zero-sensitive"), kbench_case(seqlen=8, heads=1, head_dim=8),
                       timing=timing)
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["timing"]["accounting"]["calls_per_batch"] > rec["correctness"]["seeds"]
    assert not seen_zero
