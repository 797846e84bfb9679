"""``kbench evolve``: create a lineage, run variation operators on it, inspect and transfer it."""
from __future__ import annotations

import difflib
import os
import re
import shutil
import sys
from pathlib import Path

import click

from kbench.api import BadInput, FiniteOption as Finite

from kbench_evolve.prompt import text_of

WORKSPACE = click.option("--workspace", type=click.Path(file_okay=False, path_type=Path), default=None,
                         help="Directory of lineages (default: $KBENCH_EVOLVE_DIR or ./evolve).")
DEVICE = click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")


#: control characters a model or a kernel could put in text this command prints (ANSI escapes, carriage
#: returns rewriting a line, OSC sequences setting the window title or a hyperlink): shown escaped, never sent
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text) -> str:
    """``text`` safe for a terminal: control characters but newline and tab written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _echo(text="", **kw) -> None:
    click.echo(printable(text), **kw)


def _lineage(workspace, name):
    from kbench_evolve.store import Lineage, workspace_root

    return Lineage.open(workspace_root(workspace), name)


def _private_workspace(workspace) -> None:
    """Refuse a workspace that sandboxed candidates can read (under the interpreter's or a package's folder):
    a lineage's state, memory and conversation would be theirs to quote back to the model (exit 2)."""
    from kbench.api import sandbox_readable_roots
    from kbench_evolve.store import workspace_root

    ws = workspace_root(workspace)
    real = os.path.realpath(ws)
    for root in sandbox_readable_roots():
        if real == root or real.startswith(root.rstrip("/") + "/"):
            raise BadInput(f"the workspace {ws} lies under {root}, which sandboxed candidate kernels can read: "
                           f"the lineages' state, notes and conversations would be theirs to read and quote to the "
                           f"model", where="--workspace",
                           fix="keep lineages outside the interpreter's and the packages' folders (--workspace DIR or "
                               "KBENCH_EVOLVE_DIR)")


@click.group("evolve")
def evolve_group():
    """Evolutionary search over a kernel lineage (AVO): the harness's measurement is the fitness."""


@evolve_group.command("init")
@click.argument("name")
@click.option("--seed", "seed", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Kernel file the lineage starts from (e.g. the shipped NumPy seed, see `kbench evolve seeds`).")
@click.option("--suite", "suite", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Suite whose cases define the fitness (e.g. suites/evolve-cpu.yaml).")
@WORKSPACE
@DEVICE
@click.pass_obj
def init_command(pm, name, seed, suite, workspace, device):
    """Create lineage NAME from a seed kernel; the seed, measured on SUITE, becomes v1."""
    from kbench_evolve.fitness import Evaluator
    from kbench.api import read_text
    from kbench_evolve.store import META_BYTES, Lineage, workspace_root

    ws = workspace_root(workspace)
    _private_workspace(workspace)
    lineage = Lineage.create(ws, name, seed=seed, suite_path=str(suite))
    try:
        source = read_text(seed, limit=META_BYTES, what="seed kernel")
        with lineage.hold():
            m = _measure_or_explain(Evaluator(pm, lineage.current_suite(), lineage.scratch("runs"), device=device),
                                    seed, "seed")
        if not m.correct:
            raise BadInput("the seed kernel is not correct on every case of the suite: "
                           + "; ".join(f"{c}: {w}" for c, w in m.failures.items()), file=str(seed),
                           fix="fix the seed (kbench run SUITE -b SEED shows the details)")
        v = lineage.commit(source, {"operator": "seed", "parent": None, "rationale": f"seed {seed}",
                                    "suite": lineage.meta["suite"], "suite_origin": lineage.meta["suite_origin"],
                                    "scores": m.zeroed(), "geomean": m.geomean,
                                    "profile": m.profile, "result_files": [m.result_file]})
    except BaseException:
        shutil.rmtree(lineage.root, ignore_errors=True)
        raise
    lineage.log_attempt({"operator": "seed", "outcome": "committed", "version": v.label, "geomean": m.geomean})
    _echo(f"lineage {name} in {lineage.root}: v1 = {seed} ({m.geomean:.4g} TFLOP/s geomean over "
               f"{len(m.scores)} cases); backend evolved:{name}")


def _measure_or_explain(evaluator, kernel, label):
    """One measurement; an environment that cannot measure is an error message, not a traceback."""
    from kbench.api import KbenchError
    from kbench_evolve.fitness import EnvironmentFailure

    try:
        return evaluator.measure(kernel, label=label)
    except EnvironmentFailure as exc:
        raise KbenchError(f"the harness could not measure {kernel}: {exc}",
                          fix="fix the environment (sandbox, workers; `kbench doctor`), then run the command again") from None


def _budget_options(f):
    opts = [
        click.option("--iterations", type=click.IntRange(min=0, max=10**9), help="Variations to run (each ends at a commit or --max-steps)."),
        click.option("--max-steps", type=click.IntRange(min=0, max=10**9), help="Steps per variation (model calls; candidates for mutate)."),
        click.option("--max-tokens", type=click.IntRange(min=0, max=10**15), help="Total LLM tokens for the run."),
        click.option("--max-cost", type=Finite(min=0, max=1e9), help="Total LLM cost for the run in USD (litellm cost tracking)."),
        click.option("--max-time", type=Finite(min=0, min_open=True, max=365 * 86400), help="Wall-clock seconds for the run (summed over resumes)."),
        click.option("--max-bench-calls", type=click.IntRange(min=0, max=10**9), help="kbench runs (checks, benchmarks, duels) for the run."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _model_options(f):
    opts = [
        click.option("--llm-timeout", type=Finite(min=0.1, max=86400), help="Seconds per model call [default: 120]."),
        click.option("--llm-retries", type=click.IntRange(min=0, max=100), help="Retries of a transient model error (capped backoff) "
                                                     "[default: 4]."),
        click.option("--price-input", type=Finite(min=0, max=1e6), help="USD per million input tokens, for a model litellm "
                                                       "cannot price (needed with --max-cost)."),
        click.option("--price-output", type=Finite(min=0, max=1e6), help="USD per million output tokens (with --price-input)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _outage_options(f):
    opts = [
        click.option("--unattended/--attended", default=None,
                     help="Unattended: an outage of the model or of the harness waits with capped backoff and "
                          "tries again instead of pausing (exit 3), up to --max-outage."),
        click.option("--max-outage", type=Finite(min=0, max=365 * 86400), help="Seconds an unattended run waits through one outage "
                                                      "before pausing [default: 86400]."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _budget_overrides(**kw):
    return {k: v for k, v in kw.items() if v is not None}


@evolve_group.command("run")
@click.argument("name")
@click.option("--operator", "-o", "operator", default="mutate", show_default=True,
              help="Variation operator (`kbench evolve operators` lists them).")
@_budget_options
@click.option("--model", help="litellm model id for llm/agent (default $KBENCH_EVOLVE_MODEL).")
@click.option("--api-base", help="API base URL for the model (default $KBENCH_EVOLVE_API_BASE).")
@click.option("--knowledge", "knowledge", multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Extra knowledge folder (repeatable; also $KBENCH_EVOLVE_KNOWLEDGE).")
@click.option("--rounds", type=click.IntRange(min=1, max=100), default=2, show_default=True,
              help="Interleaved champion/candidate rounds before a commit decision.")
@click.option("--min-gain", type=Finite(min=0, max=100), default=0.0, show_default=True,
              help="Required lower bound of the speedup's 95% CI above 1 (0.02 = 2%).")
@click.option("--screen-ratio", type=Finite(min=0, max=10), default=0.9, show_default=True,
              help="Drop a candidate at screening only when the top of its speedup's 95% CI against the "
                   "champion, measured in the same run, is below this.")
@_model_options
@_outage_options
@click.option("--script", type=click.Path(dir_okay=False, exists=True), hidden=True,
              help="Replay model responses from a JSON script (tests and demos; model 'kbench-replay/script').")
@click.option("--restart", is_flag=True, help="Discard an unfinished run's state and start a new run.")
@click.option("--parallel", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Candidates proposed and screened concurrently (independent operator calls); duels and "
                   "commits stay one at a time.")
@click.option("--executor", default="local", show_default=True, metavar="NAME",
              help="Where screening runs go (e.g. ray; `kbench list` shows the executors). Duels always run here.")
@click.option("--address", metavar="ADDR", help="The cluster for --executor ray (docs/scale-out.md).")
@click.option("--executor-opt", "executor_opts", multiple=True, metavar="KEY=VALUE",
              help="An executor setting for screening runs, e.g. resource=gpu_slot (repeatable).")
@click.option("--max-bench-per-variation", type=click.IntRange(1, 10**6), default=None,
              help="kbench runs the agent's tools may start in one variation (a submit counts its rounds) "
                   "[default: the larger of 8 and --max-steps]; without --max-bench-calls the run's cap is "
                   "--iterations times this.")
@click.option("--profile", type=click.Choice(["ncu"]), default=None,
              help="Profile each screening and benchmark run with Nsight Compute (GPU; outside the timed "
                   "samples): the champion's and the latest candidate's figures go into the operators' brief.")
@WORKSPACE
@DEVICE
@click.pass_obj
def run_command(pm, name, operator, iterations, max_steps, max_tokens, max_cost, max_time, max_bench_calls,
                model, api_base, knowledge, rounds, min_gain, screen_ratio, llm_timeout, llm_retries, price_input,
                price_output, unattended, max_outage, script, restart, parallel, executor, address, executor_opts,
                max_bench_per_variation, profile, workspace, device):
    """Run variation operator OP on lineage NAME until its budgets are spent.

    Exit status: 0 when the run ended (finished, budget spent, stalled), 2 on bad input or when the
    model provider refused the request (credentials, unknown model, bad request; the run is saved:
    `kbench evolve resume NAME`, maybe with another --model), 3 when paused by an outage.
    """
    from kbench_evolve.engine import RESUMABLE, Budget, make_state
    from kbench_evolve.operators import operator_registry

    _private_workspace(workspace)
    lineage = _lineage(workspace, name)
    old = lineage.load_state()
    if old and old.get("status") in RESUMABLE and not restart:
        raise BadInput(f"lineage {name!r} has an unfinished {old['operator']} run ({old['status']})",
                       fix=f"continue it with `kbench evolve resume {name}`, or start over with --restart")
    cls = operator_registry(pm).get(operator)
    budget = Budget(**_budget_overrides(iterations=iterations, max_steps=max_steps, max_tokens=max_tokens,
                                        max_cost=max_cost, max_time=max_time, max_bench_calls=max_bench_calls))
    options = {"rounds": rounds, "min_gain": min_gain, "screen_ratio": screen_ratio, "knowledge": list(knowledge),
               "device": device, "unattended": bool(unattended), "parallel": parallel,
               "executor": _screen_executor(pm, executor, address, executor_opts), "profile": profile,
               "max_outage": 86400.0 if max_outage is None else max_outage,
               "max_bench_per_variation": max_bench_per_variation}
    if cls.uses_llm:
        model = model or os.environ.get("KBENCH_EVOLVE_MODEL")
        if script:
            model = model or "kbench-replay/script"
            options["script"] = str(Path(script).resolve())
        if not model:
            raise BadInput(f"operator {operator!r} needs a model", where="--model",
                           fix="pass --model (a litellm model id, e.g. anthropic/claude-sonnet-4-5 or openai/gpt-4.1) "
                               "or set KBENCH_EVOLVE_MODEL, plus the provider's key (ANTHROPIC_API_KEY, OPENAI_API_KEY, ...)")
        options.update({"model": model, "api_base": api_base or os.environ.get("KBENCH_EVOLVE_API_BASE"),
                        "timeout": llm_timeout or 120.0,
                        "retries": 4 if llm_retries is None else llm_retries})
        options.update(_prices(price_input, price_output))
        _preflight(options, budget.max_cost)
    elif price_input is not None or price_output is not None:
        raise BadInput(f"--price-input/--price-output are for LLM operators; {operator!r} calls no model",
                       where="--price-input", fix="drop them")
    _run(pm, lineage, make_state(operator, budget, options))


def _screen_executor(pm, name: str, address: str | None, opts: tuple[str, ...]) -> dict | None:
    """The executor screening runs go to, checked now (unknown, or unable to run here: exit 2 before any work);
    None for the default, in-process local executor."""
    if name == "local" and not address and not opts:
        return None
    from kbench.api import executor_kit

    settings = {}
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep or not key:
            raise BadInput(f"--executor-opt {opt!r} is not KEY=VALUE", where="--executor-opt",
                           fix="e.g. --executor-opt resource=gpu_slot")
        settings[key] = value
    factory = pm.registry.executor(name)
    why = factory.available()
    if why:
        raise BadInput(f"executor {name!r} cannot run here: {why}", where="--executor",
                       fix="`kbench list` shows the executors and why each is unavailable")
    if "slots" not in settings:
        # one device per screening run, so that --parallel N runs N of them at once: screening runs that each
        # asked for every device of the cluster would wait on each other's devices (an executor that has no
        # such setting keeps its own)
        try:
            factory.check(executor_kit.ExecutorOptions(devices=None, address=address, settings={**settings, "slots": "1"}))
            settings = {**settings, "slots": "1"}
        except BadInput:
            pass
    factory.check(executor_kit.ExecutorOptions(devices=None, address=address, settings=settings))
    return {"name": name, "address": address, "settings": settings}


def _prices(price_input, price_output) -> dict:
    if (price_input is None) != (price_output is None):
        raise BadInput("give both --price-input and --price-output (USD per million tokens)", where="--price-input",
                       fix="e.g. --price-input 3 --price-output 15; 0 and 0 for a free local model")
    if price_input is None:
        return {}
    if price_input < 0 or price_output < 0:
        raise BadInput("prices cannot be negative", where="--price-input", fix="USD per million tokens, >= 0")
    return {"price_input": price_input, "price_output": price_output}


def _preflight(options: dict, max_cost) -> None:
    """A missing API key or an unpriced model under --max-cost: refused before anything runs (exit 2)."""
    from kbench_evolve.llm import preflight

    prices = (options["price_input"], options["price_output"]) if "price_input" in options else None
    preflight(options["model"], options.get("api_base"), max_cost=max_cost, prices=prices)


def _run(pm, lineage, state):
    from kbench_evolve.engine import run_evolution
    from kbench_evolve.knowledge import KnowledgeBase

    options = state.get("options", {})
    if options.get("script"):
        from kbench_evolve.replay import install_script

        install_script(options["script"], lineage.root / "replay-position.json")
    kb = KnowledgeBase(options.get("knowledge", ()))
    status = run_evolution(pm, lineage, state, device=options.get("device", "auto"), knowledge=kb, echo=_echo)
    champ = lineage.champion()
    s = state["spent"]
    _echo(f"{status}: {s['iterations']} variations, {s['commits']} commits, {s['bench_calls']} benchmark "
               f"runs, {s['tokens']} tokens, {cost_text(s)}, {s['time']:.0f} s; champion {champ.label} "
               f"{champ.geomean:.4g} TFLOP/s (backend evolved:{lineage.name})")
    if status in ("paused", "environment"):
        sys.exit(3)


def cost_text(spent: dict) -> str:
    """The run's model cost: unknown when any call could not be priced, never a silent $0."""
    unpriced = int(spent.get("unpriced_calls") or 0)
    if unpriced:
        return f"cost unknown ({unpriced} unpriced model calls; ${spent['cost']:.4f} for the priced ones)"
    return f"${spent['cost']:.4f}"


@evolve_group.command("resume")
@click.argument("name")
@_budget_options
@click.option("--model", help="Continue with another litellm model id (recorded in the run's state).")
@click.option("--api-base", help="Continue with another API base URL (recorded).")
@_model_options
@_outage_options
@click.option("--parallel", type=click.IntRange(1, 64), default=None,
              help="Continue with another number of concurrent candidates (recorded).")
@WORKSPACE
@click.pass_obj
def resume_command(pm, name, iterations, max_steps, max_tokens, max_cost, max_time, max_bench_calls, model,
                   api_base, llm_timeout, llm_retries, price_input, price_output, unattended, max_outage, parallel,
                   workspace):
    """Continue NAME's last run where it stopped (killed, paused by an outage, refused by the provider,
    or out of budget).

    Budget options given here replace the run's (e.g. a larger --iterations to go on after it finished);
    model options (--model, --api-base, --llm-timeout, --llm-retries, prices, --unattended) replace the
    run's and each change is recorded in the state's `changes`.
    """
    from kbench_evolve.engine import RESUMABLE
    from kbench_evolve.operators import operator_registry
    from kbench_evolve.store import now_iso

    _private_workspace(workspace)
    lineage = _lineage(workspace, name)
    state = lineage.load_state()
    if not state:
        raise BadInput(f"lineage {name!r} has no run to resume", fix=f"start one with `kbench evolve run {name}`")
    overrides = _budget_overrides(iterations=iterations, max_steps=max_steps, max_tokens=max_tokens,
                                  max_cost=max_cost, max_time=max_time, max_bench_calls=max_bench_calls)
    option_changes = {k: v for k, v in {"model": model, "api_base": api_base, "timeout": llm_timeout,
                                         "retries": llm_retries, "unattended": unattended,
                                         "max_outage": max_outage, "parallel": parallel,
                                         **_prices(price_input, price_output)}.items()
                      if v is not None and state["options"].get(k) != v}
    state["budget"] = {**state["budget"], **overrides}
    if state.get("status") not in RESUMABLE and not overrides:
        _echo(f"the last {state['operator']} run of {name} ended ({state['status']}); give a larger budget "
                   f"(e.g. --iterations) to continue it")
        return
    if option_changes:
        state.setdefault("changes", []).append({"time": now_iso(), "from": {k: state["options"].get(k)
                                                                             for k in option_changes},
                                                "to": option_changes})
        state["options"] = {**state["options"], **option_changes}
    if operator_registry(pm).get(state["operator"]).uses_llm:
        _preflight(state["options"], state["budget"].get("max_cost"))
    _echo(f"resuming the {state['operator']} run of {name} (status {state.get('status')}, "
               f"{state['spent']['iterations']} variations done"
               + (f"; now {', '.join(f'{k}={v}' for k, v in option_changes.items())}" if option_changes else "")
               + ")")
    _run(pm, lineage, state)


@evolve_group.command("log")
@click.argument("name")
@click.option("--attempts", is_flag=True, help="Also list failed attempts.")
@WORKSPACE
def log_command(name, attempts, workspace):
    """The lineage like `git log`: newest first, with scores, operator and rationale."""
    lineage = _lineage(workspace, name)
    versions = lineage.versions()
    for v in reversed(versions):
        m = v.meta
        parent = f"v{m['parent']}" if m.get("parent") else "-"
        click.secho(f"version {v.label}  {v.geomean:.4g} TFLOP/s geomean", fg="yellow")
        _echo(f"Parent:   {parent}\nOperator: {m.get('operator')}\nDate:     {m.get('committed')}\n"
                   f"Suite:    {m.get('suite')}")
        d = m.get("decision")
        if isinstance(d, dict):
            _echo(f"Decision: {_decision_text(lineage, m, d)}")
        _echo("")
        for line in text_of(m.get("rationale")).splitlines() or [""]:
            _echo(f"    {line}")
        _echo("    " + "  ".join(f"{_short(c)}={s:.4g}" for c, s in sorted((m.get("scores") or {}).items())))
        _echo("")
    tried = lineage.attempts()
    rejected = [a for a in tried if a.get("outcome") in ("rejected", "abandoned")]
    _echo(f"{len(versions)} versions, {len(rejected)} rejected or abandoned attempts (see --attempts)")
    if attempts:
        for a in rejected:
            _echo(f"  {text_of(a.get('time'), 32)} {text_of(a.get('operator'), 20):7s} {text_of(a.get('sha'), 8)} "
                       f"{text_of(a.get('outcome'), 20):9s} {text_of(a.get('reason'), 140)}")


def _decision_text(lineage, meta: dict, d: dict) -> str:
    """A committed version's decision: the speedup over its parent re-measured beside it (the number the decision
    was made on), with the parent's geomean as re-measured, as committed, and the child's."""
    def num(x, fmt=".4g"):
        return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"

    ci = d.get("ci") if isinstance(d.get("ci"), list) and len(d.get("ci")) == 2 else ["?", "?"]
    parent = meta.get("parent")
    remeasured = d.get("champion_geomean", meta.get("champion_remeasured"))
    try:
        committed = lineage.version(parent).geomean if parent else None
    except BadInput:
        committed = None
    label = f"v{parent}" if parent else "the parent"
    return (f"{num(d.get('speedup'), '.3f')}x vs {label} re-measured beside it ({label} {num(remeasured)} TFLOP/s "
            f"re-measured, {num(committed)} when committed; this version {num(d.get('candidate_geomean', meta.get('geomean')))}), "
            f"95% CI [{num(ci[0], '.3f')}, {num(ci[1], '.3f')}]")


def _short(case_id: str) -> str:
    return case_id.replace("attention[", "[")


@evolve_group.command("show")
@click.argument("name")
@click.argument("version", required=False)
@click.option("--source/--no-source", default=True, help="Print the kernel source.")
@WORKSPACE
def show_command(name, version, source, workspace):
    """One version (default: the champion): scores per case, decision, rationale, source."""
    from tabulate import tabulate

    v = _lineage(workspace, name).version(version)
    m = v.meta
    _echo(f"{name} {v.label}: {v.geomean:.4g} TFLOP/s geomean; operator {m.get('operator')}; parent "
               f"{'v' + str(m['parent']) if m.get('parent') else '-'}; committed {m.get('committed')}\n"
               f"suite {m.get('suite')}; file {v.kernel_path}\nrationale: {m.get('rationale')}\n")
    rows = [[_short(c), f"{s:.4g}", (m.get("profile") or {}).get(c, {}).get("median_s")]
            for c, s in sorted((m.get("scores") or {}).items())]
    _echo(tabulate(rows, headers=["case", "TFLOP/s", "median s"]))
    if source:
        _echo("\n" + v.source)


@evolve_group.command("diff")
@click.argument("name")
@click.argument("version", required=False)
@click.argument("other", required=False)
@WORKSPACE
def diff_command(name, version, other, workspace):
    """Unified diff: VERSION against its parent, or VERSION against OTHER."""
    lineage = _lineage(workspace, name)
    new = lineage.version(version)
    if other:
        old, new = new, lineage.version(other)
    else:
        parent = new.meta.get("parent")
        if not parent:
            _echo(f"{new.label} has no parent")
            return
        old = lineage.version(parent)
    _echo("".join(difflib.unified_diff(old.source.splitlines(keepends=True), new.source.splitlines(keepends=True),
                                            f"{name}@{old.label}", f"{name}@{new.label}")))


@evolve_group.command("transfer")
@click.argument("name")
@click.option("--suite", "suite", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The new suite (e.g. GQA shapes after an MHA lineage).")
@WORKSPACE
@DEVICE
@click.pass_obj
def transfer_command(pm, name, suite, workspace, device):
    """Continue lineage NAME on another SUITE: its champion, re-measured there, becomes the new head.

    Later `kbench evolve run NAME` optimises for the new suite (AVO's MHA -> GQA adaptation).
    """
    from kbench_evolve.engine import measuring

    _private_workspace(workspace)
    lineage = _lineage(workspace, name)
    with measuring(lineage, _echo):
        _transfer(pm, lineage, name, suite, device)


def _transfer(pm, lineage, name, suite, device) -> None:
    from kbench_evolve.fitness import Evaluator

    champ = lineage.champion()
    stored = lineage.adopt_suite(suite)
    m = _measure_or_explain(Evaluator(pm, lineage.suite_path(stored), lineage.scratch("runs"), device=device),
                            champ.kernel_path, "transfer")
    if not m.correct:
        lineage.log_attempt({"operator": "transfer", "outcome": "rejected", "suite": str(suite),
                             "reason": "incorrect on the new suite: " + "; ".join(m.failures.values())})
        raise BadInput(f"the champion {champ.label} is not correct on every case of {suite}: "
                       + "; ".join(f"{c}: {w}" for c, w in list(m.failures.items())[:3]),
                       fix="fix the kernel (or evolve it with an LLM operator on the new suite)")
    v = lineage.commit(champ.source, {"operator": "transfer", "parent": champ.number, "suite": stored,
                                      "suite_origin": str(Path(suite).resolve()),
                                      "rationale": f"transfer from {champ.meta.get('suite')} to {suite}",
                                      "scores": m.zeroed(), "geomean": m.geomean, "profile": m.profile,
                                      "result_files": [m.result_file]})
    lineage.log_attempt({"operator": "transfer", "outcome": "committed", "version": v.label, "geomean": m.geomean})
    _echo(f"{name}: {v.label} continues on {suite} ({m.geomean:.4g} TFLOP/s geomean over {len(m.scores)} cases)")


@evolve_group.command("list")
@WORKSPACE
def list_command(workspace):
    """Lineages in the workspace with their champion."""
    from kbench_evolve.store import list_lineages, workspace_root

    for lin in list_lineages(workspace_root(workspace)):
        vs = lin.versions()
        state = lin.load_state() or {}
        champ = f"{vs[-1].label} {vs[-1].geomean:.4g} TFLOP/s" if vs else "no versions"
        _echo(f"{lin.name:20s} {champ:28s} suite {lin.current_suite()}  last run: {state.get('status', '-')}")


@evolve_group.command("operators")
@click.pass_obj
def operators_command(pm):
    """Variation operators registered by plugins."""
    from kbench_evolve.operators import operator_registry

    reg = operator_registry(pm)
    for name, cls in sorted(reg.operators.items()):
        _echo(f"{name:8s} {cls.description}  [plugin {reg.owners[name]}]")


@evolve_group.command("seeds")
def seeds_command():
    """Paths of the seed kernels: NumPy (cpu) and torch-operations (torch, CPU) shipped here, the Triton ones
    (cuda: FlashAttention-2 style; sm90: Hopper TMA + warp specialisation) from kbench-triton."""
    import importlib.util
    from importlib import resources

    for entry in sorted(resources.files("kbench_evolve").joinpath("seeds").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py"):
            # first word: where it runs; "cpu" stays the NumPy seed's alone (scripts pick it with /^cpu/)
            kind = "torch" if entry.name.startswith("torch") else "cpu"
            _echo(f"{kind:5s} {entry}")
    spec = importlib.util.find_spec("kbench_triton")
    seeds_dir = Path(spec.origin).parent / "seeds" if spec and spec.origin else None
    # the FA2-style Triton seed (any sm_80+ GPU) and the Hopper one (TMA, warp specialisation; sm_90+)
    for kind, file in (("cuda", "triton_attention_seed.py"), ("sm90", "triton_hopper_seed.py")):
        if seeds_dir is not None and (seeds_dir / file).is_file():
            _echo(f"{kind:5s} {seeds_dir / file}")
        else:
            _echo(f"{kind:5s} (install kbench-triton for this Triton seed, kbench_triton/seeds/{file})")
