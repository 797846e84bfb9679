"""``agent``: AVO's variation operator. A tool-using model loop that plans, edits, checks,
benchmarks, profiles, keeps notes and submits, watched by the supervisor.

One variation is one conversation, saved (with its pending tool calls) after every step: a killed
run resumes mid-conversation, re-running the tool calls the model had asked for. The transcript of
every variation is appended to ``trajectories/<id>.jsonl``.
"""
from __future__ import annotations

import time

from kbench_evolve.operators import Operator
from kbench_evolve.store import append_jsonl

SYSTEM = """You are a GPU/CPU kernel engineer improving an attention kernel in an evolutionary lineage (AVO).
The fitness is the harness's own measurement: TFLOP/s per case of the suite, all zero if any case is wrong.
A version is committed only when it is correct on every case and faster than the champion beyond noise.
The kernel is one Python file: it defines `attention(q, k, v, out, *, causal, scale, **tunables)` with
layout (batch, seqlen, heads, head_dim), GQA when heads_q > heads_kv, causal masks aligned bottom-right,
writes `out` in the input dtype; optional SUBSTRATE, TUNABLES. Never special-case the benchmark, cache
results, copy inputs to outputs, start threads, or change precision: the harness checks for this.
Work in steps: read the lineage and the knowledge base, plan, write a candidate (a SEARCH/REPLACE patch or
full source), check it, benchmark it, and submit it with a rationale. Keep notes with write_memory."""


def brief(ctx) -> str:
    champ = ctx.champion()
    memory = ctx.lineage.read_memory()
    return (f"Lineage {ctx.lineage.name}, suite {ctx.lineage.current_suite()}. Champion {champ.label}: "
            f"{champ.geomean:.4g} TFLOP/s geomean; per case: "
            + ", ".join(f"{c} {s:.4g}" for c, s in sorted(champ.scores.items()))
            + f".\nKnowledge base:\n{ctx.knowledge.index() if ctx.knowledge else '(none)'}\n"
            + (f"Your notes so far:\n{memory}\n" if memory else "")
            + f"You have {ctx.steps_left()} steps. Improve the champion and submit.")


class AgentOperator(Operator):
    name = "agent"
    description = "AVO: multi-step tool-using LLM agent (read, edit, check, benchmark, profile, memory, submit)"
    uses_llm = True

    def vary(self, ctx) -> str:
        from kbench_evolve.llm import LLMClient
        from kbench_evolve.supervisor import Supervisor
        from kbench_evolve.tools import AgentTools

        st = ctx.op_state
        vid = st.setdefault("id", f"{time.strftime('%Y%m%d-%H%M%S')}-{ctx.spent.iterations + 1}")
        trajectory = ctx.lineage.scratch("trajectories") / f"{vid}.jsonl"
        opts = self.options
        sup = Supervisor(st, stall_steps=int(opts.get("stall_steps", 12)),
                         repeat_limit=int(opts.get("repeat_limit", 2)),
                         failure_limit=int(opts.get("failure_limit", 3)))
        tools = AgentTools(ctx, sup)
        client = LLMClient(ctx, **{k: opts[k] for k in ("model", "api_base", "timeout", "retries", "backoff")
                                   if opts.get(k) is not None})
        messages = st.get("messages")
        if not messages:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": brief(ctx)}]
            for m in messages:
                append_jsonl(trajectory, m)
            st["messages"] = messages
            ctx.save()

        def add(message) -> None:
            messages.append(message)
            append_jsonl(trajectory, message)

        while True:
            pending = _pending_calls(messages)
            if pending:  # the model asked for these (maybe before a kill): run them now
                for call in pending:
                    result = tools.call(call["function"]["name"], call["function"]["arguments"])
                    add({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                         "content": result})
                    ctx.save()
                    ctx.echo(f"  . {call['function']['name']}: {result.splitlines()[0][:100] if result else ''}")
                    if tools.committed:
                        break
                if tools.committed:
                    ctx.save()
                    return f"committed {tools.committed.label} after {ctx.spent.steps} steps"
                note = sup.check()
                if note:
                    ctx.echo(f"  ! {note[:160]}")
                    add({"role": "user", "content": note})
                ctx.save()
            if ctx.steps_left() <= 0:
                return f"no commit in {ctx.spent.steps} steps (step budget)"
            ctx.step()
            sup.on_step()
            compact(messages, int(opts.get("context_chars", CONTEXT_CHARS)))
            reply = client.complete(messages, tools.schemas())
            add(reply)
            ctx.save()
            if not reply.get("tool_calls"):
                if (reply.get("content") or "").strip().upper().startswith("GIVE UP"):
                    return "the agent gave up: " + reply["content"][:120]
                add({"role": "user", "content": "Use the tools to make progress; call submit when a checked "
                                                "candidate is faster. (Reply GIVE UP to end this variation.)"})
                note = sup.check()
                if note:
                    add({"role": "user", "content": note})
                ctx.save()


#: characters of conversation kept verbatim before old tool results are elided (~50k tokens)
CONTEXT_CHARS = 200_000


def compact(messages: list[dict], limit: int, keep_last: int = 12) -> int:
    """Elide the oldest tool results until the conversation fits ``limit`` characters.

    The system prompt, the brief, every assistant turn and the last ``keep_last`` messages stay
    whole (tool-call/result pairing is preserved); the full transcript stays in the trajectory file.
    Returns the number of results elided.
    """
    size = sum(len(str(m.get("content") or "")) for m in messages)
    elided = 0
    for m in messages[2:max(2, len(messages) - keep_last)]:
        if size <= limit:
            break
        text = str(m.get("content") or "")
        if m.get("role") == "tool" and not text.startswith("[elided"):
            m["content"] = f"[elided: {len(text)} characters of an older {m.get('name')} result]"
            size -= len(text) - len(m["content"])
            elided += 1
    return elided


def _pending_calls(messages: list[dict]) -> list[dict]:
    """Tool calls of the last assistant message that have no tool result yet."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "assistant":
            answered = {x.get("tool_call_id") for x in messages[i + 1:] if x.get("role") == "tool"}
            return [c for c in m.get("tool_calls") or [] if c["id"] not in answered]
    return []


