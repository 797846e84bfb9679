"""An RL-style loop against `kbench serve`, with a scripted policy standing in for the model.

The policy proposes kernels for the task `attention-tiny` (tasks/attention-tiny.yaml); the environment
(`kbench_serve.env.KernelEnv`, OpenEnv's reset/step shape) sends each to the server and returns the reward and
the per-stage report, which the policy reads to pick its next move. Then the same kernels go through
`reward_function`, the form an RL library calls with a batch of completions.

    kbench serve --tasks examples/rl-loop/tasks &           # or let this script start one (no --url)
    OPENBLAS_NUM_THREADS=1 python examples/rl-loop/rl_loop.py [--url http://127.0.0.1:8787] [--token T]
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

HEAD = "import numpy as np\n\n\ndef attention(q, k, v, out, *, causal, scale):\n"
# the policy's moves, each a kernel file; the comments say what the policy "learned" from the last report
MOVES = {
    "call-the-library": "import torch\n\n\ndef attention(q, k, v, out, *, causal, scale):\n"
                        "    out[...] = torch.nn.functional.scaled_dot_product_attention(\n"
                        "        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)).numpy()\n",
    "forgot-the-scale": HEAD + (
        "    s = np.einsum('bqhd,bkhd->bhqk', q, k)\n"
        "    p = np.exp(s - s.max(-1, keepdims=True))\n"
        "    out[...] = np.einsum('bhqk,bkhd->bqhd', p / p.sum(-1, keepdims=True), v)\n"),
    "head-by-head": HEAD + (  # right (GQA, causal); one (batch, head) at a time, plain matrix products
        "    sq, sk, group = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]\n"
        "    visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)\n"
        "    for b in range(q.shape[0]):\n"
        "        for h in range(q.shape[2]):\n"
        "            s = (q[b, :, h] @ k[b, :, h // group].T) * np.float32(scale)\n"
        "            if causal:\n"
        "                s = np.where(visible, s, -np.inf)\n"
        "            m = s.max(-1, keepdims=True)\n"
        "            p = np.exp(s - np.where(np.isfinite(m), m, 0))\n"
        "            l = p.sum(-1, keepdims=True)\n"
        "            out[b, :, h] = (p / np.where(l == 0, 1, l)) @ v[b, :, h // group]\n"),
    "vectorised": HEAD + (
        "    sq, sk, group = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]\n"
        "    kk, vv = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)\n"
        "    s = np.einsum('bqhd,bkhd->bhqk', q, kk, optimize=True) * np.float32(scale)\n"
        "    if causal:\n"
        "        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)\n"
        "    m = s.max(-1, keepdims=True)\n"
        "    p = np.exp(s - np.where(np.isfinite(m), m, 0))\n"
        "    l = p.sum(-1, keepdims=True)\n"
        "    out[...] = np.einsum('bhqk,bkhd->bqhd', p / np.where(l == 0, 1, l), vv, optimize=True)\n"),
}


def policy(feedback: str, tried: list[str]) -> str:
    """A scripted policy: the next move not tried yet, skipping library calls once a static check refused one."""
    for name in MOVES:
        if name in tried:
            continue
        if "static: FAILED" in feedback and name == "call-the-library":
            continue
        return name
    return "vectorised"


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = Path(tempfile.mkdtemp(prefix="rl-loop-")) / "serve.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "kbench.cli", "serve", "--tasks", str(HERE / "tasks"),
                             "--port", str(port), "--db", str(db)], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(600):
        try:
            httpx.get(url + "/healthz", timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("the server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--token", default=os.environ.get("KBENCH_SERVE_TOKEN"))
    opts = ap.parse_args()
    from kbench_serve.client import Client
    from kbench_serve.env import KernelAction, KernelEnv, reward_function

    proc, url = (None, opts.url) if opts.url else start_server()
    try:
        client = Client(url, token=opts.token)
        # every move is tried (the episode does not stop at the first right kernel): the rewards compare them
        env = KernelEnv(client, "attention-tiny", max_steps=len(MOVES), stop_when_correct=False)
        result = env.reset()
        print("task:", result.observation.task["description"].strip())
        tried: list[str] = []
        while not result.done:
            move = policy(result.observation.feedback, tried)
            tried.append(move)
            result = env.step(KernelAction(MOVES[move]))
            print(f"\nmove {move!r}: reward {result.reward:.3f}, done {result.done}")
            print(result.observation.feedback)
        reward = reward_function(client, "attention-tiny")
        batch = [f"Here is my kernel:\n```python\n{src}```" for src in MOVES.values()]
        print("\nreward_function over a batch of completions:",
              dict(zip(MOVES, (round(r, 3) for r in reward(batch)))))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
