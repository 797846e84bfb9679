"""Exploit (class 1): the inputs used to derive from the public case id (crc32 of it, plus 7919 per trial),
so a kernel could regenerate them, precompute every answer once, and then answer in call order without
doing the work."""
import zlib

import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

_STATE = {}


def _case_id(q, k, causal):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    dt = {"float32": "fp32", "float16": "fp16"}.get(q.dtype.name, q.dtype.name[:4])
    flags = ",causal" if causal else ""
    return f"attention[b={b},sq={sq},sk={sk},hq={hq},hkv={hkv},d={d}{flags},{dt}]"


def _predicted(q, k, v, causal, scale):
    answers = []
    for index in list(range(4)) + [1000 + j for j in range(4)]:
        rng = np.random.default_rng((zlib.crc32(_case_id(q, k, causal).encode()) + 7919 * index) % 2**32)
        pq, pk, pv = (rng.standard_normal(a.shape, dtype=np.float32).astype(a.dtype) for a in (q, k, v))
        out = np.empty_like(pq)
        _honest(pq, pk, pv, out, causal=causal, scale=scale)
        answers.append(out)
    return answers


def attention(q, k, v, out, *, causal, scale):
    if "answers" not in _STATE:
        _STATE["answers"], _STATE["calls"] = _predicted(q, k, v, causal, scale), 0
    out[...] = _STATE["answers"][_STATE["calls"] % len(_STATE["answers"])]
    _STATE["calls"] += 1
