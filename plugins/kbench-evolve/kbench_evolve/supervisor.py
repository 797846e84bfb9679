"""The self-supervisor: notices an unproductive agent and redirects it to a new direction.

It watches three signals (AVO's stall detection): many steps without a commit, the same candidate
written or submitted again, and correctness failures in a row. When one trips, it returns a
message that names the signal and proposes a direction not suggested before; the agent loop
appends it to the conversation as a user turn. Its counters live in the run state (resumable).
"""
from __future__ import annotations

from typing import Any

#: directions offered in turn; general to attention kernels, the first ones useful on the CPU too
DIRECTIONS = (
    "Change the tiling: try very different block sizes (TUNABLES) and the loop order (K/V outer, Q inner).",
    "Remove per-tile overhead: process several heads or query blocks per matrix multiply; hoist casts, "
    "transposes and allocations out of the inner loop; reuse buffers.",
    "Skip work that cannot matter: key tiles fully in the causal future, and masking of tiles fully visible.",
    "Single-pass softmax: fold the scale into Q once, compute the row max and the exponentials in one pass, "
    "and rescale the accumulator only when the running maximum changes (branchless, by a factor of 1 otherwise).",
    "Overlap and interleave: compute the next tile's scores while the current tile's P@V runs "
    "(on a GPU: QK/PV interleaving across warp groups; on the CPU: fewer, larger BLAS calls).",
    "Revisit precision without changing results: keep float32 accumulation but avoid float64 temporaries "
    "and needless copies of the inputs.",
    "Study the knowledge base (read_knowledge) for a technique not tried yet and test it on a subset first.",
)


class Supervisor:
    def __init__(self, state: dict[str, Any], *, stall_steps: int = 12, repeat_limit: int = 2,
                 failure_limit: int = 3) -> None:
        self.s = state.setdefault("supervisor", {"since_commit": 0, "seen": {}, "failures": 0,
                                                "interventions": [], "next_direction": 0})
        self.stall_steps = stall_steps
        self.repeat_limit = repeat_limit
        self.failure_limit = failure_limit

    @property
    def interventions(self) -> list[dict[str, Any]]:
        return self.s["interventions"]

    def on_step(self) -> None:
        self.s["since_commit"] += 1

    def on_candidate(self, sha: str) -> None:
        self.s["seen"][sha] = self.s["seen"].get(sha, 0) + 1

    def on_correctness(self, ok: bool) -> None:
        self.s["failures"] = 0 if ok else self.s["failures"] + 1

    def on_commit(self) -> None:
        self.s.update(since_commit=0, failures=0)

    def check(self) -> str | None:
        """A redirect message when a signal trips (each signal is then reset), else None."""
        why = None
        repeated = [h for h, n in self.s["seen"].items() if n >= self.repeat_limit]
        if repeated:
            why = f"the same candidate ({repeated[0][:8]}) came up {self.s['seen'][repeated[0]]} times"
            for h in repeated:
                self.s["seen"][h] = -10**6  # report once
        elif self.s["failures"] >= self.failure_limit:
            why = f"{self.s['failures']} correctness failures in a row"
            self.s["failures"] = 0
        elif self.s["since_commit"] >= self.stall_steps:
            why = f"{self.s['since_commit']} steps without a commit"
            self.s["since_commit"] = 0
        if why is None:
            return None
        direction = DIRECTIONS[self.s["next_direction"] % len(DIRECTIONS)]
        self.s["next_direction"] += 1
        self.interventions.append({"why": why, "direction": direction})
        return (f"SUPERVISOR: {why}. This line of work is not paying off: drop it and take a new direction. "
                f"Suggested: {direction} Record what you learned with write_memory first.")
