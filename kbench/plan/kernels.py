"""Kernel-level time of one forward pass on a GPU, by shape (docs/plan.md, "The step model: kernels by shape").

A roofline at a flat efficiency makes short steps too cheap: every kernel of a decode step has a floor of a few
microseconds, a small-batch GEMM reaches neither the compute nor the bandwidth roof, a decode attention kernel
over a small batch leaves most of the GPU idle, an all-reduce of a few megabytes reaches a third of the link,
and a grouped MoE GEMM with a few tokens per expert wastes most of each tile. The functions here give those
times from the shape, for a class of GPUs (NVIDIA A100, H100, H200, B200 with TensorRT-LLM-like kernels), with
constants read off published per-kernel measurements (the sources are listed in docs/plan.md); nothing is fitted
to a scenario. They apply to GPU profiles (``Assumptions.step_model == "shaped"``); CPUs and ``--step-model
roofline`` keep the plain roofline.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from typing import Sequence

#: a kernel's floor (launch, prologue, a partial last wave), seconds: GEMMs and decode attention
KERNEL_FLOOR = 3.5e-6
#: elementwise kernels (residual add + RMSNorm twice, SwiGLU activation) per layer, and their floor
ELEMENTWISE_KERNELS = 3
ELEMENTWISE_FLOOR = 3.0e-6
#: bytes an elementwise kernel moves per token: add+norm reads x and the residual, writes both (4 h elements);
#: the activation reads gate and up, writes one (3 ffn/t elements)
NORM_ELEMENTS = 4
ACT_ELEMENTS = 3
#: the exponent of the smooth maximum of compute and memory time of a GEMM: in between the roofs (a few hundred
#: tokens) neither is reached (tile quantization, a partial wave)
SMOOTH = 3.0
#: decode attention: a floor per layer and the fraction of the bandwidth reached as a function of the time the
#: layer's KV reads take at the full datasheet bandwidth (its size relative to the GPU): a batch-1 step reads
#: a few MB per layer and reaches a fifth of the bandwidth, a full batch reaches 0.85-0.9
DECODE_ATTN_FLOOR = 8.0e-6
DECODE_ATTN_EFF = ((1e-6, 0.20), (7e-6, 0.35), (27e-6, 0.50), (110e-6, 0.85), (220e-6, 0.88))
#: prefill attention (fused causal attention): a floor per layer and the fraction of the matmul peak reached
#: at long sequences (FlashAttention-3 reaches 0.6-0.75 of H100's bf16 peak in the forward pass)
PREFILL_ATTN_FLOOR = 10.0e-6
PREFILL_ATTN_EFF = 0.6
#: dense tensor throughput a GPU sustains in long GEMMs relative to its datasheet, beside the large-GEMM
#: efficiency every GPU gets (``--compute-efficiency``, 0.8): B200's 2.25 PFLOP/s bf16 dense is a boost-clock
#: figure its 1000 W budget does not hold under back-to-back tensor-core work. Two measurements agree:
#: microbenchmarks find B200 1.56x H200 in mixed-precision GEMM throughput (Jarmusch and Chandrasekaran,
#: "Microbenchmarking NVIDIA's Blackwell Architecture", arXiv 2512.02189v1) against a datasheet ratio of 2.27,
#: and TensorRT-LLM's measured context-phase kernels (aiconfigurator 0.12.0's B200 tables: Llama-3.1-70B, 8 x 512
#: tokens, 430 ms; Qwen3-32B 8 x 1000, 363 ms; Qwen3-8B 8000, 104 ms; Qwen3-30B-A3B 16 x 512, 62 ms) are
#: 1.15-1.3x what 0.8 of the datasheet gives. 0.83 of it (0.66 of the datasheet in all): Hopper and Ampere 1.
SUSTAINED_TENSOR = {"b200": 0.83}
#: all-reduce: fraction of the server link's one-way bandwidth reached (bus bandwidth 2(t-1)/t S / time) by
#: message size per device and degree, TensorRT-LLM's custom all-reduce (one-shot for small messages,
#: two-shot, NVLS on NVSwitch for large)
AR_SIZES = (32e3, 128e3, 512e3, 2e6, 8e6, 32e6, 128e6)
AR_EFF = {2: (0.09, 0.26, 0.48, 0.48, 0.50, 0.50, 0.59),
          4: (0.09, 0.21, 0.30, 0.31, 0.41, 0.57, 0.67),
          8: (0.06, 0.13, 0.14, 0.23, 0.38, 0.56, 0.75)}
#: MoE: a floor per MoE layer (router top-k, permute, two grouped GEMMs, unpermute and the weighted sum), the
#: bandwidth reached reading the experts the tokens touch, and the compute efficiency of a grouped GEMM by expert
#: width per device (narrow experts waste tiles): ``MOE_COMPUTE * f / (f + MOE_WIDTH_HALF)``
MOE_FLOOR = 20e-6
MOE_BANDWIDTH = 0.75
MOE_COMPUTE = 0.7
MOE_WIDTH_HALF = 320.0
#: bytes per token an MoE layer permutes and unpermutes (the hidden vector to each of its experts and back)
MOE_PERMUTE_PASSES = 2
#: routing is not balanced: the busiest of ``ep`` ranks carries ``1 + MOE_IMBALANCE (ep - 1)`` times the mean
#: (power-law expert popularity; 1.3 at EP 4, 1.7 at EP 8)
MOE_IMBALANCE = 0.1
#: all-to-all of expert parallelism: the fraction of the link reached and a latency per exchange
A2A_EFF = 0.3
A2A_LATENCY = 8e-6


#: attention data parallelism: a step waits for the busiest rank. With ``b`` requests spread over ``dp`` ranks
#: at random, the busiest holds about ``b/dp + c sqrt(b/dp)``, ``c`` the expected maximum of ``dp`` standard normals
DP_MAX_NORMAL = {1: 0.0, 2: 0.564, 4: 1.029, 8: 1.424, 16: 1.766}


def dp_imbalance(batch: float, dp: int) -> float:
    """How much longer the busiest of ``dp`` data-parallel ranks' attention takes than the mean rank's."""
    if dp <= 1:
        return 1.0
    c = DP_MAX_NORMAL.get(dp) or DP_MAX_NORMAL[min(DP_MAX_NORMAL, key=lambda d: abs(d - dp))]
    return 1.0 + c / math.sqrt(max(1.0, batch / dp))


def smooth_max(a: float, b: float) -> float:
    """max(a, b) rounded off where the two are close: (a^p + b^p)^(1/p)."""
    hi = a if a > b else b
    if hi <= 0:
        return 0.0
    return hi * ((a / hi) ** SMOOTH + (b / hi) ** SMOOTH) ** (1.0 / SMOOTH)


def gemm_time(m: float, n: float, k: float, flops: float, bandwidth: float, dtype_bytes: float = 2.0) -> float:
    """An (m x k) @ (k x n) GEMM on one device: the smooth maximum of its compute time (``flops``: the reached
    peak) and of reading both operands and writing the result (``bandwidth``: the reached bandwidth), plus the
    kernel floor."""
    if m <= 0:
        return 0.0
    compute = 2.0 * m * n * k / flops
    memory = dtype_bytes * (n * k + m * (n + k)) / bandwidth
    return smooth_max(compute, memory) + KERNEL_FLOOR


def _log_interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_left(xs, x)
    w = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return ys[i - 1] + w * (ys[i] - ys[i - 1])


def decode_attention_efficiency(seconds_at_peak: float) -> float:
    """Fraction of the bandwidth a decode attention layer reaches, from the time its KV reads take at the
    datasheet bandwidth."""
    xs = [x for x, _ in DECODE_ATTN_EFF]
    return _log_interp(max(seconds_at_peak, 1e-9), xs, [y for _, y in DECODE_ATTN_EFF])


def allreduce_time(nbytes: float, tp: int, link_bandwidth: float, latency: float, scale: float = 1.0) -> float:
    """One all-reduce of ``nbytes`` per device over ``tp`` devices of a server: latency + the bus traffic
    2 (tp-1)/tp S at the fraction of the link the measured custom all-reduce reaches at that size (``scale``:
    the assumed link efficiency relative to its default 0.8)."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    row = AR_EFF.get(tp) or AR_EFF[min(AR_EFF, key=lambda t: abs(math.log(t / tp)))]
    eff = min(1.0, _log_interp(nbytes, AR_SIZES, row) * scale)
    return latency + 2.0 * (tp - 1) / tp * nbytes / (link_bandwidth * eff)


def moe_layer_time(tokens: float, hidden: int, expert_ffn: int, experts: int, active: int, ep: int, moe_tp: int,
                   peak: float, bandwidth: float, dtype_bytes: float = 2.0) -> float:
    """One MoE layer (router, permute, grouped gate/up and down GEMMs, unpermute) over ``tokens`` tokens (all the
    instance's tokens: with attention data parallelism every rank's), experts split ``ep`` ways and each expert's
    width ``moe_tp`` ways, balanced routing. Compute at an efficiency that falls with the expert width per
    device; weights: the experts the tokens reach (``E (1 - (1 - k/E)^n)``), ``1/ep`` of them on each device."""
    if tokens <= 0:
        return 0.0
    f = expert_ffn / moe_tp
    routed = tokens * active / ep * (1.0 + MOE_IMBALANCE * (ep - 1))   # (token, expert) pairs, busiest device
    compute = 2.0 * 3 * hidden * f * routed / (peak * MOE_COMPUTE * f / (f + MOE_WIDTH_HALF))
    touched = experts / ep * (1.0 - (1.0 - active / experts) ** tokens)
    memory = touched * 3 * hidden * f * dtype_bytes / (bandwidth * MOE_BANDWIDTH)
    permute = MOE_PERMUTE_PASSES * 2 * routed * hidden * dtype_bytes / (bandwidth * MOE_BANDWIDTH)
    return MOE_FLOOR + smooth_max(compute, memory) + permute


def alltoall_time(tokens: float, hidden: int, active: int, ep: int, link_bandwidth: float,
                  dtype_bytes: float = 2.0) -> float:
    """Dispatch and combine of expert parallelism over ``ep`` devices: each device sends the hidden vector of
    its share of tokens to the (ep-1)/ep of their experts held elsewhere, and gets the results back."""
    if ep <= 1 or tokens <= 0:
        return 0.0
    per_device = tokens / ep * min(active, ep) * (ep - 1) / ep * hidden * dtype_bytes
    return 2 * (A2A_LATENCY + per_device / (link_bandwidth * A2A_EFF))
