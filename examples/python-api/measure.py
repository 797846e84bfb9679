# %% [markdown]
# # Measuring kernels from Python with `kbench.api.measure`
#
# A notebook in plain Python (Jupyter, VS Code and `jupytext` open the `# %%` cells as a notebook; `python
# measure.py` runs it whole, in a minute on two cores). `measure` goes through the runner of `kbench run`:
# the same judge (inputs from a per-run secret, outputs verified and time accounted for in the trusted
# process), the same sandbox for kernel files, the same timing settings (docs/evaluators.md).

# %%
import numpy as np

import kbench.api as kb

CASES = [{"seqlen": 256, "heads": 4, "head_dim": 64, "causal": [False, True]}]  # grid entries: 2 cases
QUICK = {"warmup_time": 0.01, "min_samples": 7, "min_time": 0.05, "max_time": 0.3}  # overrides of the timing


# %% [markdown]
# ## A callable against a registered backend
# A callable has a kernel file's signature: the op's inputs, its output, then the op's keyword arguments. It is
# your own code, so it is trusted: it runs in this process (no sandbox), and its records say so.

# %%
def my_attention(q, k, v, out, *, causal, scale):
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    out[...] = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)


m = kb.measure(my_attention, baseline="numpy-flash", cases=CASES, device="cpu", timing=QUICK)
print(m.names, "baseline:", m.baseline, "all passed:", m.passed)
for r in m.records:
    print(f"{r.backend:14} {r.case_id:60} {r.status.value:7} {r.median * 1e3:7.3f} ms  rel. L2 {r.rel_l2:.1e}")
print("trusted, in-process:", m.of()[0].backend_info["trusted"])
print(f"speedup over numpy-flash: {m.speedup():.2f}x (geometric mean over the cases)")
for case, s in m.speedups().items():
    print(f"  {case}: {s.speedup:.2f}x, 95% CI [{s.ci_low:.2f}, {s.ci_high:.2f}]")

# %% [markdown]
# ## A wrong kernel fails with the reason, never with a number

# %%
def forgot_the_scale(q, k, v, out, *, causal, scale):
    my_attention(q, k, v, out, causal=causal, scale=1.0)


bad = kb.measure(forgot_the_scale, cases=CASES, device="cpu", timing=QUICK)
for key, why in bad.failures().items():
    print(key, "->", why)

# %% [markdown]
# ## A kernel file (untrusted: sandboxed worker, static checks), cases from a suite file, a result file kept
# `output=` a directory writes `<dir>/<machine>/<suite>-<time>.json` (here `results/`, the results root of
# `kbench run` in the current directory), which `kbench show`, `kbench compare` and `kbench publish` read.

# %%
from pathlib import Path  # noqa: E402

here = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
seed = here.parent / "openevolve" / "seed.py"
kept = kb.measure(seed, "numpy-flash", suite=here.parent / "openevolve" / "suite.yaml", output="results")
print(kept.names, "->", kept.result_file)
print({r.backend: r.extra.get("worker", {}).get("sandbox") for r in kept.records})
