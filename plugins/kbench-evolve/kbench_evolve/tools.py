"""The agent's tools: read the lineage and the knowledge base, edit, check, benchmark, profile,
keep notes, submit. Every measurement goes through the harness (``VariationContext``)."""
from __future__ import annotations

import json
from typing import Any, Callable

from kbench.api import KbenchError

from kbench_evolve import source as src
from kbench_evolve.llm import tool_schema
from kbench_evolve.supervisor import Supervisor


#: characters of one tool result sent back to the model
MAX_RESULT = 20_000


class ToolError(Exception):
    """A tool refused its arguments; the message goes back to the model."""


class AgentTools:
    def __init__(self, ctx, supervisor: Supervisor) -> None:
        self.ctx = ctx
        self.sup = supervisor
        self.committed = None
        self.last_profile: dict[str, Any] = {}
        self.table: dict[str, tuple[Callable[..., str], dict[str, Any]]] = {
            "list_versions": (self.list_versions, tool_schema(
                "list_versions", "The lineage: every committed version with geomean TFLOP/s, parent, operator, "
                "rationale; and the last rejected attempts with why.")),
            "read_version": (self.read_version, tool_schema(
                "read_version", "Full source, per-case TFLOP/s and profile (roofline metrics) of one version.",
                {"version": {"type": "string", "description": "e.g. v3; default: the champion"}})),
            "list_knowledge": (self.list_knowledge, tool_schema(
                "list_knowledge", "Titles of the knowledge-base documents.")),
            "read_knowledge": (self.read_knowledge, tool_schema(
                "read_knowledge", "Read one knowledge-base document.",
                {"name": {"type": "string"}}, ("name",))),
            "read_memory": (self.read_memory, tool_schema(
                "read_memory", "Your persistent notes for this lineage (kept across variations and runs).")),
            "write_memory": (self.write_memory, tool_schema(
                "write_memory", "Append a note to your persistent memory (what worked, what failed, ideas).",
                {"note": {"type": "string"}}, ("note",))),
            "write_candidate": (self.write_candidate, tool_schema(
                "write_candidate", "Set the candidate kernel: either the full `source`, or a `patch` of "
                "SEARCH/REPLACE blocks applied to the current candidate (initially the champion).",
                {"source": {"type": "string"}, "patch": {"type": "string"}})),
            "check": (self.check, tool_schema(
                "check", "Correctness of the candidate on every case of the suite (the harness's check).")),
            "benchmark": (self.benchmark, tool_schema(
                "benchmark", "Measure the candidate and the champion side by side in one kbench run (TFLOP/s per case, "
                "each case of both timed back to back); costs 1 kbench run; "
                "`cases` is an optional keyword expression over case ids (e.g. 'causal and sq=1024').",
                {"cases": {"type": "string"}})),
            "profile": (self.profile, tool_schema(
                "profile", "Roofline profile of the last benchmark: attained TFLOP/s and GB/s, intensity, "
                "bound, fraction of the roof, median time per case.")),
            "submit": (self.submit, tool_schema(
                "submit", "Submit the candidate: the harness re-measures it interleaved with the champion and "
                "commits it only if it is correct everywhere and faster beyond noise.",
                {"rationale": {"type": "string", "description": "what changed and why it should be faster"}},
                ("rationale",))),
        }

    # -- plumbing -------------------------------------------------------------------------------

    def schemas(self) -> list[dict[str, Any]]:
        return [schema for _, schema in self.table.values()]

    def call(self, name: str, arguments: str | None) -> str:
        text = self._call(name, arguments)
        if len(text) > MAX_RESULT:  # keep one tool result from flooding the model's context
            text = text[:MAX_RESULT] + f"\n[... {len(text) - MAX_RESULT} more characters cut]"
        return text

    def _call(self, name: str, arguments: str | None) -> str:
        if name not in self.table:
            return f"ERROR: no tool {name!r}; tools: {', '.join(self.table)}"
        try:
            args = json.loads(arguments) if arguments else {}
            if not isinstance(args, dict):
                raise ToolError("arguments must be a JSON object")
            return self.table[name][0](**args)
        except json.JSONDecodeError as exc:
            return f"ERROR: arguments are not valid JSON: {exc.msg}"
        except TypeError as exc:
            return f"ERROR: bad arguments for {name}: {exc}"
        except KbenchError as exc:  # e.g. an unknown version: the model asked for something that is not there
            return f"ERROR: {exc.message}"
        except (ToolError, src.PatchError, KeyError) as exc:
            return f"ERROR: {exc.args[0] if exc.args else exc}"

    @property
    def candidate(self) -> str | None:
        return self.ctx.op_state.get("candidate")

    def _need_candidate(self) -> str:
        if not self.candidate:
            raise ToolError("no candidate yet: call write_candidate first")
        return self.candidate

    # -- tools ----------------------------------------------------------------------------------

    def list_versions(self) -> str:
        lines = []
        for v in self.ctx.lineage.versions():
            m = v.meta
            lines.append(f"{v.label}: {v.geomean:.4g} TFLOP/s geomean, parent {m.get('parent') or '-'}, "
                         f"{m.get('operator')}: {(m.get('rationale') or '')[:160]}")
        rejected = [a for a in self.ctx.lineage.attempts() if a.get("outcome") == "rejected"][-8:]
        if rejected:
            lines.append("recent rejected attempts:")
            lines += [f"- {a.get('operator')} {a.get('sha', '')[:8]}: {a.get('reason', '')[:160]}" for a in rejected]
        return "\n".join(lines)

    def read_version(self, version: str | None = None) -> str:
        v = self.ctx.lineage.version(version)
        return json.dumps({"version": v.label, "geomean": v.geomean, "scores": v.scores,
                           "profile": v.meta.get("profile"), "rationale": v.meta.get("rationale"),
                           "source": v.source}, indent=1)

    def list_knowledge(self) -> str:
        return self.ctx.knowledge.index() if self.ctx.knowledge else "(no knowledge base)"

    def read_knowledge(self, name: str) -> str:
        if not self.ctx.knowledge:
            raise ToolError("no knowledge base")
        return self.ctx.knowledge.read(name)

    def read_memory(self) -> str:
        return self.ctx.lineage.read_memory() or "(empty)"

    def write_memory(self, note: str) -> str:
        self.ctx.lineage.write_memory(self.ctx.lineage.read_memory() + f"- {note.strip()}\n")
        return "noted"

    def write_candidate(self, source: str | None = None, patch: str | None = None) -> str:
        if (source is None) == (patch is None):
            raise ToolError("give exactly one of `source` or `patch`")
        if patch is not None:
            source = src.apply_patch(self.candidate or self.ctx.champion().source, patch)
        bad = src.check_syntax(source)
        if bad:
            raise ToolError(f"candidate not written: {bad}")
        self.ctx.op_state["candidate"] = source
        sha = src.sha(source)
        self.sup.on_candidate(sha)
        self.ctx.save()
        return (f"candidate written ({len(source.splitlines())} lines, sha {sha[:8]}); tunables: "
                f"{ {k: s.get('default') for k, s in src.tunables(source).items()} }")

    def check(self) -> str:
        m = self.ctx.check(self._need_candidate())
        self.sup.on_correctness(m.correct)
        if m.correct:
            return f"PASSED on all {len(m.scores)} cases"
        return "FAILED:\n" + "\n".join(f"- {c}: {w}" for c, w in m.failures.items())

    def benchmark(self, cases: str | None = None) -> str:
        champ, m = self.ctx.benchmark(self._need_candidate(), keyword=cases)
        self.sup.on_correctness(m.correct)
        self.last_profile = m.profile
        lines = [f"{c}: {s:.4g} TFLOP/s (champion {self.ctx.champion().label} measured alongside: "
                 f"{champ.scores.get(c, 0):.4g}, ratio {s / champ.scores[c] if champ.scores.get(c) else 0:.3f})"
                 for c, s in sorted(m.scores.items())]
        if m.failures:
            lines += [f"FAILED {c}: {w}" for c, w in m.failures.items()]
        lines.append(f"geomean {m.geomean:.4g} TFLOP/s vs champion {champ.geomean:.4g} over these cases, both "
                     f"measured in this run (one run is noisy: submit decides on repeated interleaved runs)")
        return "\n".join(lines)

    def profile(self) -> str:
        if not self.last_profile:
            raise ToolError("nothing measured yet: call benchmark first")
        note = ("" if self.ctx.evaluator.device == "cuda" else
                "\n(hardware counters are not available on this device; these are the harness's roofline figures)")
        return json.dumps(self.last_profile, indent=1) + note

    def submit(self, rationale: str) -> str:
        cand = self._need_candidate()
        result = self.ctx.submit(cand, rationale=rationale)
        if result.measurement is not None or "incorrect" in result.reason:
            self.sup.on_correctness("incorrect" not in result.reason)
        if result.committed:
            self.committed = result.version
            self.sup.on_commit()
        return result.text()
