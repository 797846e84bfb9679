"""The ``triton`` backends and the ``triton`` kernel-file substrate.

Both hand the harness's device arrays (CuPy on the ``cuda`` device; bf16 stored as uint16) to Triton
as zero-copy torch views (``kbench.api.as_torch``); Triton launches on torch's current
stream, which is CuPy's default stream (the legacy null stream), so the harness's CUDA events bracket
the kernel. The kernels: ``kbench_triton/seeds/triton_attention_seed.py`` (FlashAttention-2 algorithm, any
GPU Triton supports) and ``kbench_triton/seeds/triton_hopper_seed.py`` (sm_90+: TMA tensor descriptors,
warp specialisation), each a kernel file and an evolve seed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from kbench.api import Backend, Case, Substrate, Tunable, softmax_scale

from kbench_triton import runtime

#: the seed module's TUNABLES, mirrored without importing triton (the plugin must import fast);
#: tests/test_plugin.py asserts both stay equal
TUNABLE_NAMES = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
#: the kernel's source: the backends' kernel and the evolve plugin's seed genome
SEED_PATH = Path(__file__).parent / "seeds" / "triton_attention_seed.py"
#: the Hopper kernel's source (backend ``triton-hopper``, the second seed genome)
HOPPER_SEED_PATH = Path(__file__).parent / "seeds" / "triton_hopper_seed.py"
#: the Hopper seed's TUNABLES, mirrored like TUNABLE_NAMES
HOPPER_TUNABLE_NAMES = (*TUNABLE_NAMES, "WARP_SPECIALIZE")
#: the ``triton`` backend's backward tiles (modes bwd, fwd_bwd): "BLOCK_M/BLOCK_N/num_warps/num_stages" of its
#: dK/dV and dQ kernels, e.g. ``triton[bwd_dkdv=32/128/8/2]``; None: ``backward.bwd_config``'s table
BWD_TUNABLE_NAMES = ("bwd_dkdv", "bwd_dq")
_TILE_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def parse_tiles(name: str, text: str) -> dict[str, int]:
    """``"32/128/8/2"`` -> {BLOCK_M: 32, BLOCK_N: 128, num_warps: 8, num_stages: 2}; ValueError naming ``name``."""
    parts = str(text).split("/")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"tunable {name}={text!r}: write BLOCK_M/BLOCK_N/num_warps/num_stages, e.g. 32/128/8/2")
    return dict(zip(_TILE_KEYS, (int(p) for p in parts)))


def kernel_module():
    """The kernel's module (imports triton)."""
    from kbench_triton.seeds import triton_attention_seed

    return triton_attention_seed


def hopper_module():
    """The Hopper kernel's module (imports triton)."""
    from kbench_triton.seeds import triton_hopper_seed

    return triton_hopper_seed


def _torch_views(arrays, dtype):
    from kbench.api import as_torch

    return [as_torch(a, dtype) for a in arrays]


class TritonAttention(Backend):
    """kbench's own Triton kernel with the per-shape configuration of the seed's ``CONFIGS`` table.

    Settings given to the constructor (``BLOCK_M=...``) override the table for every shape.
    """

    name = "triton"
    op = "attention"
    device = "cuda"
    description = "kbench's Triton kernel (FlashAttention-2 algorithm), configuration per shape"
    tunables = {**{n: Tunable(None, (), f"{n}; None: from the seed's CONFIGS table for the shape")
                   for n in TUNABLE_NAMES},
                **{n: Tunable(None, (), f"backward {n[4:]} kernel tiles BLOCK_M/BLOCK_N/num_warps/num_stages "
                                        f"(e.g. 32/128/8/2); None: backward.bwd_config's table")
                   for n in BWD_TUNABLE_NAMES}}
    source_path = str(SEED_PATH)
    #: the kernel module's accessor (the subclass for Hopper swaps it)
    module = staticmethod(kernel_module)
    #: modes bwd and fwd_bwd: the backward of ``kbench_triton/backward.py`` (the subclasses do not have one)
    features = frozenset({"bwd", "fwd_bwd"})

    def __init__(self, **settings: Any) -> None:
        unknown = set(settings) - set(self.tunables)
        if unknown:
            raise TypeError(f"unknown tunable(s) {sorted(unknown)}; known: {', '.join(self.tunables)}")
        self.settings = {k: v for k, v in settings.items() if v is not None}

    def available(self) -> str | None:
        return runtime.unavailable_reason()

    def supports(self, case: Case) -> str | None:
        return self.module().supports(case.params)

    def config(self, case: Case) -> dict[str, int]:
        config = self.module().config_for(case["head_dim"], case["causal"], str(case.dtype))
        return {**config, **{k: v for k, v in self.settings.items() if k not in BWD_TUNABLE_NAMES}}

    def _launcher(self, case: Case) -> Callable[..., None]:
        mod, config = self.module(), self.config(case)

        def launch(q, k, v, out, *, causal, scale):
            mod.attention(q, k, v, out, causal=causal, scale=scale, **config)
        return launch

    def prepare(self, case: Case):
        if case.params.get("mode", "fwd") != "fwd":
            return self._training(case)
        launch = self._launcher(case)
        causal, scale, dtype = case["causal"], softmax_scale(case), case.dtype

        def run(q, k, v, out):
            launch(*_torch_views((q, k, v, out), dtype), causal=causal, scale=scale)
        return run

    def _training(self, case: Case):
        """Modes bwd/fwd_bwd: a ``kbench.api.TrainingKernel`` (forward saving the log-sum-exp, then the
        deterministic backward); the tunables set the forward's tiles, the backward's come from its table."""
        from kbench_triton import backward

        tiles = backward.bwd_config(case["head_dim"], str(case.dtype))
        for name in BWD_TUNABLE_NAMES:
            if self.settings.get(name) is not None:
                tiles[name[4:]] = parse_tiles(name, self.settings[name])
        return backward.TritonTraining(causal=case["causal"], scale=softmax_scale(case), dtype=case.dtype,
                                       fwd_config=self.config(case), bwd_config=tiles)

    def info(self) -> dict[str, Any]:
        return {"triton": runtime.triton_version(), "settings": dict(self.settings), "source": self.source_path}


class TritonAutotunedAttention(TritonAttention):
    """The same kernel; ``triton.autotune`` picks among the seed's ``AUTOTUNE_CONFIGS`` per shape.

    The autotuner times its candidates on the first call; ``prepare`` makes that call on scratch
    tensors of the case's shape, so autotuning stays out of the checked and timed calls.
    """

    name = "triton-autotune"
    description = "kbench's Triton kernel, configuration chosen by triton.autotune per shape"
    tunables = {}
    features = frozenset()

    def __init__(self) -> None:
        super().__init__()
        #: head_dim -> the autotuned kernel (the autotuner's own cache of choices lives in it); kept here,
        #: in the trusted backend, because the seed module, also run as a kernel file, may hold no state
        self._autotuned: dict[int, Any] = {}

    def _launcher(self, case: Case) -> Callable[..., None]:
        import triton

        seed = kernel_module()

        def attention_autotuned(q, k, v, out, *, causal: bool, scale: float) -> None:
            head_dim = q.shape[3]
            if head_dim not in self._autotuned:
                configs = [triton.Config({"BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"]}, num_warps=c["num_warps"],
                                         num_stages=c["num_stages"])
                           for c in seed.AUTOTUNE_CONFIGS.get(head_dim, (seed.config_for(head_dim, causal),))]
                self._autotuned[head_dim] = triton.autotune(configs=configs, key=["seqlen_q", "seqlen_kv", "CAUSAL"])(
                    seed.attention_fwd_kernel)
            args, constexprs, programs_bh = seed.launch_args(q, k, v, out, causal=causal, scale=scale)

            def grid(meta):
                return (triton.cdiv(q.shape[1], meta["BLOCK_M"]), programs_bh)

            self._autotuned[head_dim][grid](*args, **constexprs)

        return attention_autotuned

    def prepare(self, case: Case):
        import torch

        from kbench.api import torch_dtype

        run = super().prepare(case)
        p, dt = case.params, torch_dtype(case.dtype)
        q = torch.randn(p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"], device="cuda", dtype=dt)
        k = torch.randn(p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"], device="cuda", dtype=dt)
        self._launcher(case)(q, k, torch.randn_like(k), torch.empty_like(q), causal=p["causal"],
                             scale=softmax_scale(case))
        torch.cuda.synchronize()
        return run


class TritonHopperAttention(TritonAttention):
    """The Hopper kernel (``seeds/triton_hopper_seed.py``): TMA tensor descriptors, warp-specialised key
    loop, per-shape configuration from its ``CONFIGS``. Needs compute capability 9.0 or newer (TMA)."""

    name = "triton-hopper"
    description = "kbench's Triton kernel for sm_90+: TMA tensor descriptors, warp specialisation"
    tunables = {n: Tunable(None, (), f"{n}; None: from the Hopper seed's CONFIGS table for the shape")
                for n in HOPPER_TUNABLE_NAMES}
    source_path = str(HOPPER_SEED_PATH)
    module = staticmethod(hopper_module)
    features = frozenset()

    def available(self) -> str | None:
        reason = runtime.unavailable_reason()
        if reason:
            return reason
        return runtime.capability_below((9, 0), "TMA tensor descriptors and wgmma")


class TritonSubstrate(Substrate):
    """Kernel files with ``SUBSTRATE = "triton"``: their function receives torch CUDA tensors.

    ``fn(q, k, v, out, *, causal, scale, **tunables)`` writes ``out`` (a torch view of the harness's
    poisoned buffer) or returns a torch tensor, handed back to the harness as a device array.
    """

    name = "triton"
    device = "cuda"

    def available(self) -> str | None:
        return runtime.unavailable_reason()

    def adapt(self, fn: Callable[..., Any], case: Case, kwargs: dict[str, Any]) -> Callable[..., Any]:
        dtype = case.dtype

        def run(**arrays):
            # positional in the runner's order: the inputs, then the outputs (out; dq, dk, dv for a backward)
            tensors = dict(zip(arrays, _torch_views(arrays.values(), dtype)))
            result = fn(*tensors.values(), **kwargs)
            if result is None or result is tensors.get("out"):
                return None
            if isinstance(result, dict):
                return {name: _device_array(t, like=arrays[name]) for name, t in result.items()}
            return _device_array(result, like=arrays["out"])
        return run

    def adapt_training(self, forward: Callable[..., Any], backward: Callable[..., Any], case: Case,
                       kwargs: dict[str, Any]):
        """A file's ``attention_forward``/``attention_backward`` (modes bwd, fwd_bwd) on torch views."""
        dtype = case.dtype

        def forward_views(*arrays, **kw):
            return forward(*_torch_views(arrays, dtype), **kw)

        def backward_views(saved, *arrays, **kw):
            return backward(saved, *_torch_views(arrays, dtype), **kw)
        return super().adapt_training(forward_views, backward_views, case, kwargs)


def _device_array(tensor, *, like):
    """A torch result as the harness's kind of array: NumPy for CPU tensors (interpreter), else CuPy."""
    import numpy as np
    import torch

    if isinstance(like, np.ndarray):
        host = tensor.detach().cpu()
        if host.dtype == torch.bfloat16:
            return host.view(torch.int16).numpy().view(like.dtype)
        return host.numpy()
    from kbench.api import to_device_array

    return to_device_array(tensor)
