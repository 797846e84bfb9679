"""An RL environment and a reward function over ``kbench serve``.

:class:`KernelEnv` has the reset/step shape of OpenEnv's HTTP environments (``reset() -> StepResult``,
``step(action) -> StepResult`` with ``observation``, ``reward``, ``done``). ``openenv-core`` 0.3 is on PyPI but
pulls in gradio, fastmcp, huggingface_hub and openai, so it is not a dependency: :class:`StepResult` has the
same fields as ``openenv.core.client_types.StepResult`` and an OpenEnv-based loop reads it unchanged.

:func:`reward_function` makes a callable of the signature RL libraries call per batch
(``reward(completions, **kwargs) -> list[float]``, TRL's ``GRPOTrainer(reward_funcs=...)`` form): each
completion's kernel (the last fenced Python block, else the whole text) is evaluated by the server, all of a
batch at once, and its reward returned.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

from kbench_serve.client import Client, ServeError

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass
class KernelAction:
    source: str


@dataclass
class KernelObservation:
    task: dict[str, Any]
    feedback: str = ""
    report: dict[str, Any] | None = None
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    observation: KernelObservation
    reward: float | None = None
    done: bool = False


def extract_kernel(text: str) -> str:
    """The kernel in a model's completion: its last fenced Python block, else the text itself."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def feedback(ev: dict[str, Any]) -> str:
    """The report in a few lines for the next prompt: each stage that ran, the failing one's reason."""
    lines = [f"outcome: {ev.get('outcome')}, reward {ev.get('reward')}"]
    for stage in (ev.get("report") or {}).get("stages", []):
        mark = "ok" if stage.get("ok") else "FAILED"
        lines.append(f"  {stage['stage']}: {mark}" + (f": {stage['reason']}" if stage.get("reason") else ""))
    return "\n".join(lines)


class KernelEnv:
    """One episode = up to ``max_steps`` kernels for one task; it ends early when a kernel passes every stage
    and ``stop_when_correct``. A harness failure (outcome ``error``) gives ``reward None``: drop the sample."""

    def __init__(self, client: Client, task: str, *, max_steps: int = 4, stop_when_correct: bool = True) -> None:
        self.client, self.task_id, self.max_steps = client, task, max_steps
        self.stop_when_correct = stop_when_correct
        self.steps = 0
        self.task: dict[str, Any] | None = None

    def reset(self) -> StepResult:
        self.steps = 0
        found = [t for t in self.client.tasks() if t["id"] == self.task_id]
        if not found:
            raise ServeError(f"the server has no task {self.task_id!r}", 404)
        self.task = found[0]
        return StepResult(KernelObservation(task=self.task, feedback=self.task.get("description", "")))

    def step(self, action: KernelAction | str) -> StepResult:
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        source = action.source if isinstance(action, KernelAction) else str(action)
        self.steps += 1
        ev = self.client.evaluate(self.task_id, source)
        reward = ev.get("reward")
        done = self.steps >= self.max_steps or (self.stop_when_correct and ev.get("outcome") == "passed")
        obs = KernelObservation(task=self.task, feedback=feedback(ev), report=ev.get("report"), done=done,
                                reward=reward, metadata={"evaluation": ev["id"], "outcome": ev.get("outcome")})
        return StepResult(obs, reward, done)


def reward_function(client: Client, task: str, *, parallel: int = 16, on_error: float | None = 0.0):
    """``reward(completions, **kwargs) -> list[float]`` for an RL library's rollout loop. ``on_error``: the
    value given when the harness could not measure (``None`` keeps it out, if the library accepts None)."""

    def one(completion: Any) -> float | None:
        text = completion if isinstance(completion, str) else _text(completion)
        ev = client.evaluate(task, extract_kernel(text))
        return on_error if ev.get("outcome") == "error" else float(ev.get("reward") or 0.0)

    def reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(completions)))) as pool:
            return list(pool.map(one, completions))

    reward.__name__ = f"kbench_{task}"
    return reward


def _text(completion: Any) -> str:
    """A chat completion (a list of messages) -> the last message's content."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)
