"""``llm``: a one-shot rewrite. One model call sees the lineage, the champion, recent failures and
the knowledge base and answers with SEARCH/REPLACE blocks; the patched kernel is submitted.
A malformed patch costs a step and is retried with the error shown to the model."""
from __future__ import annotations

import time

from kbench_evolve import source as src
from kbench_evolve.operators import Operator
from kbench_evolve.prompt import fence
from kbench_evolve.store import append_jsonl
from kbench_evolve.tools import RATIONALE_CHARS

ANSWER = """
Answer with one line `RATIONALE: ...` and then one or more SEARCH/REPLACE blocks against the champion's
source (the format of the system prompt). No tools here: the harness checks, measures and decides."""

#: documents put into the prompt whole, by the champion's substrate (the rest are listed by title)
KEY_DOCS = ("attention-online-softmax.md", "avo-optimisations.md")
SUBSTRATE_DOCS = {"numpy": ("numpy-cpu-kernels.md",), "torch": ("torch-cpu-kernels.md",),
                  "triton": ("flashattention-2-3-4.md", "hopper-blackwell-tips.md"),
                  "cupy": ("flashattention-2-3-4.md", "hopper-blackwell-tips.md")}


class LLMRewriteOperator(Operator):
    name = "llm"
    description = "one-shot LLM rewrite of the champion as a SEARCH/REPLACE patch (lineage + knowledge in the prompt)"
    uses_llm = True

    def prompt(self, ctx) -> str:
        """The agent's brief (device, roofs, substrate, budgets, champion and its profile, lineage,
        rejected attempts, notes) plus the key knowledge documents whole, and the answer format."""
        from kbench_evolve.prompt import brief

        kb = ctx.knowledge
        substrate = src.module_globals(ctx.champion().source).get("SUBSTRATE", "numpy")
        names = KEY_DOCS + SUBSTRATE_DOCS.get(substrate, ())
        docs = "\n\n".join(kb.read(n) for n in names if n in kb.names()) if kb else ""
        return brief(ctx) + ("\n\nKey knowledge:\n" + docs if docs else "") + "\n" + ANSWER

    def vary(self, ctx) -> str:
        from kbench_evolve.llm import LLMClient

        from kbench_evolve.operators.agent import LLM_OPTIONS
        from kbench_evolve.prompt import usage_entry

        client = LLMClient(ctx, **{k: self.options[k] for k in LLM_OPTIONS if self.options.get(k) is not None})

        def on_overflow(msgs: list[dict]) -> bool:
            """Drop the oldest rejected exchanges (the first prompt stays): the context window is full."""
            if len(msgs) <= 4:
                return False
            del msgs[2:4]
            return True

        from kbench_evolve.prompt import SYSTEM

        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.prompt(ctx)}]
        trajectory = ctx.lineage.scratch("trajectories") / f"{time.strftime('%Y%m%d-%H%M%S')}-llm.jsonl"
        for m in messages:
            append_jsonl(trajectory, m)
        while ctx.steps_left() > 0:
            ctx.step()
            reply = client.complete(messages, compact=on_overflow)
            append_jsonl(trajectory, usage_entry(reply, client))
            reply = {"role": "assistant", "content": reply.get("content")}  # no tools here: tool calls are not kept
            text = reply.get("content") or ""
            if text.strip().upper().startswith("GIVE UP"):  # the system prompt's convention
                return "the model gave up: " + text.strip()[:120]
            rationale = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                              if line.upper().startswith("RATIONALE:")), "llm rewrite")[:RATIONALE_CHARS]
            try:
                candidate, bad = src.apply_patch(ctx.champion().source, text), ""
            except src.PatchError as exc:
                bad, candidate = f"bad patch: {' '.join(str(exc).split())[:300]}", None
            if candidate is None:
                ctx.lineage.log_attempt({"operator": self.name, "outcome": "rejected", "reason": bad,
                                         "rationale": rationale})
                ctx.echo(f"  ! the model's reply has no patch that applies ({bad[:120]}); asking again "
                         f"(step {ctx.spent.steps} of {ctx.budget.max_steps})")
                messages += [reply, {"role": "user", "content": "The patch could not be applied:\n"
                                     + fence(bad, "the patch error, quoting your reply")
                                     + "\nAnswer again in the required format."}]
                continue
            result = ctx.submit(candidate, rationale=rationale)
            if result.committed:
                return f"committed {result.version.label}"
            messages += [reply, {"role": "user", "content": "The harness rejected it:\n"
                                 + fence(result.reason, "the harness's reason (it may quote the candidate's output)")
                                 + "\nPropose a different change."}]
        return f"no commit in {ctx.spent.steps} steps (step budget)"
