"""The agent's tools: read the lineage and the knowledge base, edit, check, benchmark, profile,
keep notes, submit. Every measurement goes through the harness (``VariationContext``).

The model is untrusted too: every call's arguments are checked against the tool's JSON schema (types, lengths,
no unknown keys, valid Unicode) before the tool runs; any error inside a tool goes back as ``ERROR: ...`` (only a
budget stop, an outage, another worker's commit and Ctrl-C end the run, as they would anywhere); text a kernel
printed and the model's own notes go back fenced as untrusted data (:func:`kbench_evolve.prompt.fence`); and the
measuring tools are capped per reply, per variation and per run (:class:`Limits`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from kbench.api import KbenchError

from kbench_evolve import source as src
from kbench_evolve.llm import tool_schema
from kbench_evolve.prompt import fence, text_of
from kbench_evolve.supervisor import Supervisor


#: characters of one tool result sent back to the model
MAX_RESULT = 20_000
#: longest arguments: a memory note, a rationale, a case expression, a kernel's source or patch
NOTE_CHARS = 4_000
RATIONALE_CHARS = 2_000
SOURCE_CHARS = 400_000
#: JSON-schema keywords checked here but not sent to the provider
_LOCAL_KEYWORDS = ("maxLength", "minLength", "pattern")
#: the tools that run the harness (kbench runs); submit costs ``ctx.submit_cost()`` runs, the others one
MEASURING = ("check", "benchmark", "submit")


@dataclass(frozen=True)
class Limits:
    """What one model reply, one variation and one run may spend through the tools."""

    calls_per_reply: int = 16        # tool calls answered per reply; the rest answered ERROR, not run
    measuring_per_reply: int = 3     # of which check/benchmark/submit calls
    bench_per_variation: int = 20    # kbench runs a variation's tools may start (a submit counts its rounds)
    bench_per_run: int | None = None  # when the run has no --max-bench-calls: iterations x bench_per_variation

    @classmethod
    def from_options(cls, opts: dict[str, Any], budget) -> Limits:
        per_var = int(opts.get("max_bench_per_variation") or max(8, budget.max_steps))
        return cls(calls_per_reply=int(opts.get("max_calls_per_reply") or 16),
                   measuring_per_reply=int(opts.get("max_measuring_per_reply") or 3),
                   bench_per_variation=per_var,
                   bench_per_run=None if budget.max_bench_calls is not None else budget.iterations * per_var)


class ToolError(Exception):
    """A tool refused its arguments; the message goes back to the model."""


class AgentTools:
    def __init__(self, ctx, supervisor: Supervisor, limits: Limits | None = None) -> None:
        self.ctx = ctx
        self.sup = supervisor
        self.limits = limits or Limits()
        self.committed = None
        self.last_profile: dict[str, Any] = {}
        self._validators: dict[str, Any] = {}
        self.table: dict[str, tuple[Callable[..., str], dict[str, Any]]] = {
            "list_versions": (self.list_versions, tool_schema(
                "list_versions", "The lineage: every committed version with geomean TFLOP/s, parent, operator, "
                "rationale; and the last rejected attempts with why.")),
            "read_version": (self.read_version, tool_schema(
                "read_version", "Full source, per-case TFLOP/s and profile (roofline metrics) of one version.",
                {"version": {"type": "string", "maxLength": 16, "pattern": "^(@?v?[0-9]{1,6}|best|latest|champion)$",
                             "description": "e.g. v3 (at most 16 characters); default: the champion"}})),
            "list_knowledge": (self.list_knowledge, tool_schema(
                "list_knowledge", "Titles of the knowledge-base documents.")),
            "read_knowledge": (self.read_knowledge, tool_schema(
                "read_knowledge", "Read one knowledge-base document.",
                {"name": {"type": "string", "maxLength": 256}}, ("name",))),
            "read_memory": (self.read_memory, tool_schema(
                "read_memory", "Your persistent notes for this lineage (kept across variations and runs).")),
            "write_memory": (self.write_memory, tool_schema(
                "write_memory", f"Append a note (at most {NOTE_CHARS} characters) to your persistent memory (what "
                "worked, what failed, ideas); the oldest notes are dropped past 256 kB.",
                {"note": {"type": "string", "minLength": 1, "maxLength": NOTE_CHARS}}, ("note",))),
            "write_candidate": (self.write_candidate, tool_schema(
                "write_candidate", "Set the candidate kernel: either the full `source`, or a `patch` of "
                "SEARCH/REPLACE blocks applied to the current candidate (initially the champion).",
                {"source": {"type": "string", "maxLength": SOURCE_CHARS},
                 "patch": {"type": "string", "maxLength": SOURCE_CHARS}})),
            "check": (self.check, tool_schema(
                "check", "Correctness of the candidate on every case of the suite (the harness's check).")),
            "benchmark": (self.benchmark, tool_schema(
                "benchmark", "Measure the candidate and the champion side by side in one kbench run (TFLOP/s per case, "
                "each case of both timed back to back); costs 1 kbench run; "
                "`cases` is an optional keyword expression over case ids (e.g. 'causal and sq=1024').",
                {"cases": {"type": "string", "maxLength": 400}})),
            "profile": (self.profile, tool_schema(
                "profile", "Roofline profile of the last benchmark: attained TFLOP/s and GB/s, intensity, "
                "bound, fraction of the roof, median time per case.")),
            "submit": (self.submit, tool_schema(
                "submit", "Submit the candidate: the harness re-measures it interleaved with the champion and "
                "commits it only if it is correct everywhere and faster beyond noise.",
                {"rationale": {"type": "string", "maxLength": RATIONALE_CHARS,
                               "description": f"what changed and why it should be faster (at most {RATIONALE_CHARS} "
                                              "characters)"}},
                ("rationale",))),
        }

    # -- plumbing -------------------------------------------------------------------------------

    def schemas(self) -> list[dict[str, Any]]:
        """The tools as sent to the provider: types and descriptions only (some providers refuse JSON-schema
        keywords such as ``pattern``); the limits are checked here (:meth:`_arguments`)."""
        out = []
        for _, schema in self.table.values():
            params = schema["function"]["parameters"]
            props = {k: {kk: vv for kk, vv in v.items() if kk not in _LOCAL_KEYWORDS}
                     for k, v in params["properties"].items()}
            out.append({**schema, "function": {**schema["function"], "parameters": {**params, "properties": props}}})
        return out

    def call(self, name: str, arguments: str | None) -> str:
        """The tool's answer; never raises but for what ends a run anyway (a budget, an outage, Ctrl-C)."""
        from kbench_evolve.engine import BudgetExhausted, LLMUnavailable, ProviderRejected, Superseded
        from kbench_evolve.fitness import EnvironmentFailure

        try:
            text = self._call(name, arguments)
        except (BudgetExhausted, Superseded, LLMUnavailable, ProviderRejected, EnvironmentFailure):
            raise
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to read, not a traceback
            text = f"ERROR: {name} failed: {type(exc).__name__}: {_oneline(exc)}"
            self.ctx.echo(f"  ! tool {name} failed: {type(exc).__name__}: {_oneline(exc)[:160]}")
        if len(text) > MAX_RESULT:  # keep one tool result from flooding the model's context
            text = text[:MAX_RESULT] + f"\n[... {len(text) - MAX_RESULT} more characters cut]"
        return text

    def refusal(self, calls: list[dict[str, Any]], index: int) -> str | None:
        """Why call ``index`` of one reply's ``calls`` is not run (the per-reply caps), or None. Decided by position,
        so a resumed run answers the same calls the same way."""
        lim = self.limits
        if index >= lim.calls_per_reply:
            return (f"ERROR: not run: at most {lim.calls_per_reply} tool calls are answered per reply "
                    f"(this reply made {len(calls)}); ask again in your next reply")
        name = _name(calls[index])
        if name in MEASURING:
            before = sum(1 for c in calls[:index] if _name(c) in MEASURING)
            if before >= lim.measuring_per_reply:
                return (f"ERROR: not run: at most {lim.measuring_per_reply} check/benchmark/submit calls per reply "
                        f"(each is a kbench run); look at the results first, then ask again")
        return None

    def _validator(self, name: str):
        if name not in self._validators:
            import jsonschema

            schema = json.loads(json.dumps(self.table[name][1]["function"]["parameters"]))
            schema["additionalProperties"] = False
            for key, prop in schema["properties"].items():  # an optional argument may be given as null
                if key not in schema.get("required", ()) and isinstance(prop.get("type"), str):
                    prop["type"] = [prop["type"], "null"]
            self._validators[name] = jsonschema.Draft202012Validator(schema)
        return self._validators[name]

    def _arguments(self, name: str, arguments: Any) -> dict[str, Any]:
        """The call's arguments, checked against the tool's schema; ToolError naming what is wrong."""
        if arguments is None or arguments == "":
            args: Any = {}
        elif isinstance(arguments, str):
            if len(arguments) > 2 * SOURCE_CHARS:
                raise ToolError(f"arguments of {len(arguments)} characters: at most {SOURCE_CHARS} per argument")
            try:
                args = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError) as exc:
                raise ToolError(f"arguments are not valid JSON: {getattr(exc, 'msg', type(exc).__name__)}") from None
        else:
            args = arguments
        if not isinstance(args, dict):
            raise ToolError(f"arguments must be a JSON object, not {type(args).__name__}")
        errors = sorted(self._validator(name).iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            err = errors[0]
            where = ".".join(str(p) for p in err.absolute_path)
            raise ToolError(f"bad arguments for {name}" + (f" ({where})" if where else "") + f": "
                            f"{_oneline(err.message)[:200]}; schema: {json.dumps(self.table[name][1]['function']['parameters'])[:400]}")
        for key, value in args.items():
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise ToolError(f"bad arguments for {name} ({key}): not valid text (a lone UTF-16 surrogate at "
                                    f"position {exc.start})") from None
        return args

    def _call(self, name: str, arguments: str | None) -> str:
        if name not in self.table:
            return f"ERROR: no tool {text_of(name, 64)!r}; tools: {', '.join(self.table)}"
        try:
            args = self._arguments(name, arguments)
            self._charge(name)
            before = self.ctx.spent.bench_calls
            try:
                return self.table[name][0](**args)
            finally:  # the kbench runs it did start (a submit refused as a duplicate starts none)
                st = self.ctx.op_state
                st["bench_calls"] = int(st.get("bench_calls") or 0) + max(0, self.ctx.spent.bench_calls - before)
        except KbenchError as exc:  # e.g. an unknown version: the model asked for something that is not there
            return f"ERROR: {exc.message}"
        except (ToolError, src.PatchError, KeyError) as exc:
            return f"ERROR: {exc.args[0] if exc.args else exc}"

    def _charge(self, name: str) -> None:
        """Refuse a measuring tool whose kbench runs would pass the variation's or the run's cap."""
        if name not in MEASURING:
            return
        self._need_candidate()  # no candidate: refused before anything is counted
        cost = self.ctx.submit_cost() if name == "submit" else 1
        st = self.ctx.op_state
        used = int(st.get("bench_calls") or 0)
        lim = self.limits
        if used + cost > lim.bench_per_variation:
            raise ToolError(f"not run: this variation may start {lim.bench_per_variation} kbench runs and has "
                            f"started {used}; {name} costs {cost}. Submit what you have or reply GIVE UP")
        if lim.bench_per_run is not None and self.ctx.spent.bench_calls + cost > lim.bench_per_run:
            raise ToolError(f"not run: the run may start {lim.bench_per_run} kbench runs and has started "
                            f"{self.ctx.spent.bench_calls}; {name} costs {cost}. Reply GIVE UP")

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
            lines.append(f"{v.label}: {v.geomean:.4g} TFLOP/s geomean, parent {text_of(m.get('parent')) or '-'}, "
                         f"{text_of(m.get('operator'), 20)}: {text_of(m.get('rationale'), 160)}")
        rejected = [a for a in self.ctx.lineage.attempts() if a.get("outcome") == "rejected"][-8:]
        if rejected:
            lines.append("recent rejected attempts:")
            lines.append(fence("\n".join(f"- {text_of(a.get('operator'), 20)} {text_of(a.get('sha'), 8)}: "
                                         f"{text_of(a.get('reason'), 160)}" for a in rejected),
                               "why they were rejected (quoting the kernels' output)"))
        return fence("\n".join(lines), "the lineage: rationales written by models") if lines else "(no versions)"

    def read_version(self, version: str | None = None) -> str:
        v = self.ctx.lineage.version(version)
        return (json.dumps({"version": v.label, "geomean": v.geomean, "scores": v.scores,
                            "profile": v.meta.get("profile")}, indent=1)
                + "\nsource:\n" + fence(v.source, f"{v.label}'s source, written by a model")
                + "\nrationale:\n" + fence(v.meta.get("rationale"), f"{v.label}'s rationale, written by a model"))

    def list_knowledge(self) -> str:
        return self.ctx.knowledge.index() if self.ctx.knowledge else "(no knowledge base)"

    def read_knowledge(self, name: str) -> str:
        if not self.ctx.knowledge:
            raise ToolError("no knowledge base")
        return self.ctx.knowledge.read(name)

    def read_memory(self) -> str:
        memory = self.ctx.lineage.read_memory()
        return fence(memory, "your notes") if memory else "(empty)"

    def write_memory(self, note: str) -> str:
        dropped = self.ctx.lineage.append_memory(note)
        return "noted" + (" (the oldest notes were dropped: memory is kept under 256 kB)" if dropped else "")

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
        return (f"candidate written ({len(source.splitlines())} lines, sha {sha[:8]}); tunables: "
                f"{ {k: s.get('default') for k, s in src.tunables(source).items()} }")

    def check(self) -> str:
        m = self.ctx.check(self._need_candidate())
        self.sup.on_correctness(m.correct)
        if m.correct:
            return f"PASSED on all {len(m.scores)} cases"
        return "FAILED:\n" + fence("\n".join(f"- {c}: {w}" for c, w in m.failures.items()),
                                   "the harness's failure reasons, quoting the candidate's own output")

    def benchmark(self, cases: str | None = None) -> str:
        champ, m = self.ctx.benchmark(self._need_candidate(), keyword=cases)
        self.sup.on_correctness(m.correct)
        self.last_profile = m.profile
        lines = [f"{c}: {s:.4g} TFLOP/s (champion {self.ctx.champion().label} measured alongside: "
                 f"{champ.scores.get(c, 0):.4g}, ratio {s / champ.scores[c] if champ.scores.get(c) else 0:.3f})"
                 for c, s in sorted(m.scores.items())]
        if m.failures:
            lines.append("FAILED:\n" + fence("\n".join(f"{c}: {w}" for c, w in m.failures.items()),
                                             "the harness's failure reasons, quoting the candidate's own output"))
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
        return "not committed:\n" + fence(result.reason, "the harness's reason (it may quote the candidate's output)")


def _name(call: dict[str, Any]) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    return text_of(fn.get("name")) if isinstance(fn, dict) else ""


def _oneline(exc: Any) -> str:
    return " ".join(str(exc).split())
