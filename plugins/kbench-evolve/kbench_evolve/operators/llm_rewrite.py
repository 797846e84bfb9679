"""``llm``: a one-shot rewrite. One model call sees the lineage, the champion, recent failures and
the knowledge base and answers with SEARCH/REPLACE blocks; the patched kernel is submitted.
A malformed patch costs a step and is retried with the error shown to the model."""
from __future__ import annotations

import time

from kbench_evolve import source as src
from kbench_evolve.operators import Operator
from kbench_evolve.store import append_jsonl

PROMPT = """You improve an attention kernel of an evolutionary lineage. Fitness: TFLOP/s per case measured by the
harness, all zero if any case is wrong; a change is kept only if correct everywhere and faster beyond noise.

Lineage (oldest first):
{lineage}

Recent rejected attempts (do not repeat them):
{rejected}

Knowledge:
{knowledge}

Champion {label} source:
```python
{source}
```

Answer with one line `RATIONALE: ...` and then one or more blocks, each exactly:
<<<<<<< SEARCH
lines copied exactly from the champion
=======
replacement lines
>>>>>>> REPLACE
"""

#: documents put into the prompt whole (the rest are listed by title)
KEY_DOCS = ("attention-online-softmax.md", "avo-optimisations.md", "numpy-cpu-kernels.md")


class LLMRewriteOperator(Operator):
    name = "llm"
    description = "one-shot LLM rewrite of the champion as a SEARCH/REPLACE patch (lineage + knowledge in the prompt)"
    uses_llm = True

    def prompt(self, ctx) -> str:
        champ = ctx.champion()
        lineage = "\n".join(f"{v.label}: {v.geomean:.4g} TFLOP/s, {v.meta.get('operator')}: "
                            f"{(v.meta.get('rationale') or '')[:200]}" for v in ctx.lineage.versions())
        rejected = [a for a in ctx.lineage.attempts() if a.get("outcome") == "rejected"][-6:]
        kb = ctx.knowledge
        knowledge = ""
        if kb:
            knowledge = kb.index() + "\n\n" + "\n\n".join(kb.read(n) for n in KEY_DOCS if n in kb.names())
        return PROMPT.format(lineage=lineage, label=champ.label, source=champ.source, knowledge=knowledge,
                             rejected="\n".join(f"- {a.get('rationale', '')[:120]} -> {a.get('reason', '')[:120]}"
                                                for a in rejected) or "(none)")

    def vary(self, ctx) -> str:
        from kbench_evolve.llm import LLMClient

        from kbench_evolve.operators.agent import LLM_OPTIONS
        from kbench_evolve.prompt import usage_entry

        client = LLMClient(ctx, **{k: self.options[k] for k in LLM_OPTIONS if self.options.get(k) is not None})

        def on_overflow(msgs: list[dict]) -> bool:
            """Drop the oldest rejected exchanges (the first prompt stays): the context window is full."""
            if len(msgs) <= 3:
                return False
            del msgs[1:3]
            return True

        messages = [{"role": "user", "content": self.prompt(ctx)}]
        trajectory = ctx.lineage.scratch("trajectories") / f"{time.strftime('%Y%m%d-%H%M%S')}-llm.jsonl"
        append_jsonl(trajectory, messages[0])
        while ctx.steps_left() > 0:
            ctx.step()
            reply = client.complete(messages, compact=on_overflow)
            append_jsonl(trajectory, usage_entry(reply, client))
            text = reply.get("content") or ""
            rationale = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                              if line.upper().startswith("RATIONALE:")), "llm rewrite")
            try:
                candidate = src.apply_patch(ctx.champion().source, text)
            except src.PatchError as exc:
                ctx.lineage.log_attempt({"operator": self.name, "outcome": "rejected", "reason": f"bad patch: {exc}",
                                         "rationale": rationale})
                messages += [reply, {"role": "user", "content": f"The patch could not be applied: {exc}. "
                                                                "Answer again in the required format."}]
                continue
            result = ctx.submit(candidate, rationale=rationale)
            if result.committed:
                return f"committed {result.version.label}"
            messages += [reply, {"role": "user", "content": f"The harness rejected it: {result.reason}. "
                                                            "Propose a different change."}]
        return f"no commit in {ctx.spent.steps} steps (step budget)"
