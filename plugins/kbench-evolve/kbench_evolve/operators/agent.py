"""``agent``: AVO's variation operator. A tool-using model loop that plans, edits, checks,
benchmarks, profiles, keeps notes and submits, watched by the supervisor.

One variation is one conversation, saved (with its pending tool calls) after every step: a killed
run resumes mid-conversation, re-running the tool calls the model had asked for. The transcript of
every variation is appended to ``trajectories/<id>.jsonl``.
"""
from __future__ import annotations

import json
import time

from kbench_evolve.operators import Operator
from kbench_evolve.prompt import SYSTEM, brief, usage_entry
from kbench_evolve.store import append_jsonl

#: run options handed to the model client
LLM_OPTIONS = ("model", "api_base", "timeout", "retries", "backoff", "max_backoff", "price_input", "price_output")


class AgentOperator(Operator):
    name = "agent"
    description = "AVO: multi-step tool-using LLM agent (read, edit, check, benchmark, profile, memory, submit)"
    uses_llm = True

    def vary(self, ctx) -> str:
        from kbench_evolve.llm import LLMClient
        from kbench_evolve.supervisor import Supervisor
        from kbench_evolve.tools import MEASURING, AgentTools, Limits

        st = ctx.op_state
        vid = st.setdefault("id", f"{time.strftime('%Y%m%d-%H%M%S')}-{ctx.spent.iterations + 1}")
        trajectory = ctx.lineage.scratch("trajectories") / f"{vid}.jsonl"
        opts = self.options
        sup = Supervisor(st, stall_steps=int(opts.get("stall_steps", 12)),
                         repeat_limit=int(opts.get("repeat_limit", 2)),
                         failure_limit=int(opts.get("failure_limit", 3)))
        tools = AgentTools(ctx, sup, Limits.from_options(opts, ctx.budget))
        client = LLMClient(ctx, **{k: opts[k] for k in LLM_OPTIONS if opts.get(k) is not None})
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
            calls, pending = _pending_calls(messages)
            if pending:  # the model asked for these (maybe before a kill): run them now
                for index, call in pending:
                    name, arguments = _call_parts(call)
                    result = tools.refusal(calls, index) or tools.call(name, arguments)
                    add({"role": "tool", "tool_call_id": call.get("id"), "name": name[:64], "content": result})
                    if name in MEASURING:  # saved after each kbench run; cheap calls once per reply (below)
                        ctx.save()
                    ctx.echo(f"  . {name[:40]}: {_first_line(result)[:100]}")
                    if tools.committed:
                        break
                if tools.committed:
                    ctx.save()
                    return f"committed {tools.committed.label} after {ctx.spent.steps} steps"
                dropped = st.pop("dropped_calls", None)
                if dropped:
                    add({"role": "user", "content": f"ERROR: your reply asked for {dropped} tool calls; at most "
                                                    f"{tools.limits.calls_per_reply} are run per reply: the first "
                                                    f"{tools.limits.calls_per_reply} were, the others dropped unrun."})
                note = sup.check()
                if note:
                    ctx.echo(f"  ! {note[:160]}")
                    add({"role": "user", "content": note})
                ctx.save()
            if ctx.steps_left() <= 0:
                return f"no commit in {ctx.spent.steps} steps (step budget)"
            ctx.step()
            sup.on_step()
            compact(messages, int(st.get("context_chars") or opts.get("context_chars", CONTEXT_CHARS)))

            def on_overflow(msgs: list[dict]) -> bool:
                """The provider's context window is smaller than we thought: halve our limit and compact."""
                size = sum(_size(m) for m in msgs)
                st["context_chars"] = max(2_000, size // 2)
                return compact(msgs, st["context_chars"], keep_last=4) > 0

            reply = client.complete(messages, tools.schemas(), compact=on_overflow)
            asked = reply.get("tool_calls") or []
            if len(asked) > tools.limits.calls_per_reply:  # not kept, so not answered one by one, nor resent
                reply["tool_calls"] = asked[:tools.limits.calls_per_reply]
                st["dropped_calls"] = len(asked)
            messages.append(reply)
            append_jsonl(trajectory, usage_entry(reply, client))
            ctx.save()
            if not reply.get("tool_calls"):
                if (reply.get("content") or "").strip().upper().startswith("GIVE UP"):  # the convention
                    return "the agent gave up: " + reply["content"][:120]
                add({"role": "user", "content": "Use the tools to make progress; call submit when a checked "
                                                "candidate is faster. (Reply GIVE UP to end this variation.)"})
                note = sup.check()
                if note:
                    add({"role": "user", "content": note})
                ctx.save()


#: characters of conversation kept verbatim before old tool results are elided (~50k tokens)
CONTEXT_CHARS = 200_000


def _size(m: dict) -> int:
    """Characters of a message that are sent: its content and its tool calls' arguments."""
    return len(str(m.get("content") or "")) + sum(len(str((c.get("function") or {}).get("arguments") or ""))
                                                  for c in m.get("tool_calls") or [] if isinstance(c, dict))


#: an older reply's text or tool arguments longer than this are elided when tool results were not enough
LONG_REPLY = 4_000


def compact(messages: list[dict], limit: int, keep_last: int = 12) -> int:
    """Elide the oldest tool results until the conversation fits ``limit`` characters; if that is not enough
    (a model or provider that writes huge replies), the oldest long replies' text and tool arguments too.

    The system prompt, the brief and the last ``keep_last`` messages stay whole, and so does every assistant
    turn unless the second pass is needed (tool-call/result pairing is preserved); the full transcript stays
    in the trajectory file. Returns the number of messages elided.
    """
    size = sum(_size(m) for m in messages)
    elided = 0
    older = messages[2:max(2, len(messages) - keep_last)]
    for m in older:
        if size <= limit:
            break
        text = str(m.get("content") or "")
        if m.get("role") == "tool" and not text.startswith("[elided"):
            m["content"] = f"[elided: {len(text)} characters of an older {m.get('name')} result]"
            size -= len(text) - len(m["content"])
            elided += 1
    for m in older:
        if size <= limit:
            break
        if m.get("role") != "assistant" or _size(m) <= LONG_REPLY:
            continue
        before = _size(m)
        text = str(m.get("content") or "")
        if len(text) > LONG_REPLY:
            m["content"] = f"[elided: {len(text)} characters of an earlier reply]"
        for c in m.get("tool_calls") or []:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict) and len(str(fn.get("arguments") or "")) > LONG_REPLY:
                fn["arguments"] = json.dumps({"elided": f"{len(str(fn['arguments']))} characters of arguments"})
        size -= before - _size(m)
        elided += 1
    return elided


def _first_line(text: str) -> str:
    """The first line of a tool result worth a console line (inside a fence when it starts with one)."""
    for line in (text or "").splitlines():
        if line.startswith(("<untrusted ", "</untrusted ")):
            continue
        return line[2:] if line.startswith("| ") else line
    return ""


def _pending_calls(messages: list[dict]) -> tuple[list[dict], list[tuple[int, dict]]]:
    """The tool calls of the last assistant message, and those of them (with their positions) that have no
    tool result yet."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "assistant":
            answered = {x.get("tool_call_id") for x in messages[i + 1:] if x.get("role") == "tool"}
            calls = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            return calls, [(n, c) for n, c in enumerate(calls) if c.get("id") not in answered]
    return [], []


def _call_parts(call: dict) -> tuple[str, str | None]:
    """A stored tool call's name and arguments, whatever a saved conversation holds."""
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    name, arguments = fn.get("name"), fn.get("arguments")
    return (name if isinstance(name, str) else str(name), arguments if isinstance(arguments, (str, type(None)))
            else json.dumps(arguments))


