"""``kbench run SUITE``: measure every selected backend on every case of a suite."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from kbench.options import Finite

from kbench.hints import traceback_hint
from kbench.suite import MAX_CASES, load_suite
from kbench.tables import records_table, status_summary


def _is_kernel_file(pattern: str) -> bool:
    return pattern.endswith(".py") or Path(pattern).is_file()


@click.command("run")
@click.argument("suite", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("-b", "--backend", "backends", multiple=True, metavar="PATTERN",
              help="Backend name pattern (fnmatch, '!' excludes) or a kernel file path; repeatable. "
                   "Default: the suite's selection.")
@click.option("-k", "keyword", metavar="EXPR", help='Keyword expression over backend and case id, e.g. "d=128 and not causal".')
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (accelerator if usable).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Result file (default results/<machine>/<suite>-<time>.json).")
@click.option("--resume", type=click.Path(dir_okay=False, path_type=Path), metavar="RESULT",
              help="Finish an interrupted run: same suite, device and selection as RESULT; only missing records run.")
@click.option("--isolate/--no-isolate", default=True, show_default=True,
              help="Run trusted backends in a worker process (--no-isolate: in this process, for debugging). "
                   "Untrusted backends and kernel files always run in sandboxed workers.")
@click.option("--case-timeout", type=Finite(min=0, min_open=True, max=7 * 86400), metavar="SECONDS",
              help="Seconds one (backend, case) may take in a worker (default: the suite's timing.case_timeout).")
@click.option("--trust-kernel-files", is_flag=True,
              help="Load -b kernel files as trusted: no sandbox or static checks; in-process with --no-isolate.")
@click.option("--max-cases", type=click.IntRange(min=1, max=10**9), default=MAX_CASES, show_default=True,
              help="Refuse a grid of more cases than this before expanding it.")
@click.option("--force", is_flag=True, help="Overwrite the -o file if it exists (otherwise refused).")
@click.option("--allow-different-machine", is_flag=True,
              help="With --resume: finish a file made on another machine or environment (recorded in the file).")
@click.option("--allow-unsandboxed", is_flag=True,
              help="Where the OS sandbox does not work (no user namespaces: gVisor, some containers), run untrusted "
                   "backends without it (weaker isolation; recorded in the result file). See docs/sandbox.md.")
@click.option("--executor", default="local", show_default=True, metavar="NAME",
              help="Where the jobs run: local (this host), or a plugin's (ray). `kbench list` shows them. "
                   "See docs/scale-out.md.")
@click.option("--devices", metavar="0,1,...",
              help="Device indices: one job at a time on each, in parallel (local: one worker pool per GPU pinned "
                   "with CUDA_VISIBLE_DEVICES; on the CPU, independent slots). Default: one job at a time.")
@click.option("--address", metavar="ADDR", help="The cluster to run on (--executor ray: ray://host:10001, "
                                                 "host:6379 or auto); default: start a local one.")
@click.option("--executor-opt", "executor_opts", multiple=True, metavar="KEY=VALUE",
              help="An executor setting, e.g. resource=gpu_slot or slots=4 for ray (docs/scale-out.md); repeatable.")
@click.option("--progress/--no-progress", default=None,
              help="Progress: a bar on stderr when it is a terminal; a line per finished record on stdout when it is "
                   "not a terminal (`> log`, CI) and the format is table. --progress: lines on stderr when it is not a "
                   "terminal; --no-progress: neither.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]), default="table",
              show_default=True, help="Format of the table printed at the end.")
@click.option("--profile", type=click.Choice(["ncu"]), default=None,
              help="After each passed record, profile it with Nsight Compute outside the timed samples "
                   "(record['profile']; `kbench show --profile`). See docs/gpu.md.")
@click.option("--rounds", type=click.IntRange(min=1, max=16), default=None, metavar="N",
              help="Take each record's samples in N rounds spread over the run, pooled (default: the suite's "
                   "timing.rounds, else 1). Two runs of the same code then compare quietly on a shared machine: "
                   "see docs/compare.md.")
@click.option("--threads", "threads", metavar="N", default=None,
              help="BLAS/OpenMP/torch threads per worker (default 1: workers never oversubscribe the cores and a "
                   "CPU time does not depend on the machine's load; 0: the libraries' own defaults). Recorded in "
                   "the result (machine.threads). See docs/compare.md, \"Threads\".")
@click.pass_obj
def run_command(pm, suite, backends, keyword, device, output, resume, isolate, case_timeout, trust_kernel_files,
                allow_unsandboxed,
                max_cases, force, allow_different_machine, executor, devices, address, executor_opts, progress, fmt,
                profile, rounds, threads):
    """Run SUITE (a YAML file) on this machine and write a result file.

    Exit status: 0 when every measured case passed, 1 when some failed or errored, 2 on bad input
    (including -k matching nothing, an existing -o file without --force, a result file another run is
    writing, a result file that cannot be written: the message says what it still holds, and records the
    environment could not measure: a file-size limit, no sandbox), 130 when interrupted (Ctrl-C) and 143
    when terminated (SIGTERM), also while the file is being finished; an interrupted run is finished with
    `kbench run --resume RESULT`.
    """
    from kbench.errors import BadInput
    from kbench.run.runner import RunRequest, resume_request

    existing = []
    if resume is not None:
        if suite is not None or backends or keyword or output or force or rounds:
            raise BadInput("--resume takes the suite, selection and output from the result file", where="--resume",
                           fix="give only --resume RESULT (plus --case-timeout, --no-isolate, --executor or --devices if wanted)")
        req, existing = resume_request(pm, resume, allow_different_machine=allow_different_machine)
        req.isolate = req.isolate and isolate
        req.case_timeout = case_timeout or req.case_timeout
        req.allow_unsandboxed = req.allow_unsandboxed or allow_unsandboxed
    else:
        if suite is None:
            raise BadInput("no suite given", where="SUITE", fix="kbench run suites/smoke.yaml, or --resume RESULT")
        req = RunRequest(suite=load_suite(suite), device=device,
                         backend_patterns=[b for b in backends if not _is_kernel_file(b)],
                         kernel_files=[b for b in backends if _is_kernel_file(b)], keyword=keyword, output=output,
                         isolate=isolate, case_timeout=case_timeout, trust_kernel_files=trust_kernel_files,
                         allow_unsandboxed=allow_unsandboxed,
                         max_cases=max_cases, force=force, rounds=rounds)
    from kbench.run.executors import parse_devices

    req.executor, req.devices, req.executor_address = executor, parse_devices(devices), address
    req.executor_settings = _executor_settings(executor_opts)
    req.profile = profile

    from kbench.threads import apply_threads, parse_threads, restore_threads

    # before planning: the header records machine.threads from the environment the workers inherit
    thread_setting = apply_threads(None if threads is None else parse_threads(threads), in_process=not req.isolate)
    try:
        _run_planned(pm, req, resume, existing, progress, fmt, thread_setting)
    finally:
        restore_threads()


def _run_planned(pm, req, resume, existing, progress, fmt, thread_setting):
    """The run itself, once the request and the thread setting are decided."""
    from kbench.errors import BadInput
    from kbench.run.runner import RunInterrupted, exit_code, plan_run, run_suite

    planned = plan_run(pm, req)
    work = planned.work()
    done = {(r["case_id"], r["backend"]) for r in existing}
    left = sum((c.id, b.name) not in done for c, b in work)
    click.echo(f"kbench: {req.suite.name} on {planned.ctx.device.name}"
               f" ({planned.ctx.hardware.title if planned.ctx.hardware else 'no hardware profile'}): "
               f"{len(planned.plan.cases)} cases x {len(planned.backends)} backends = {len(work)} records"
               + (f" in {planned.rounds} rounds" if planned.rounds > 1 else "")
               + (f", {left} left to run" if resume is not None else "")
               + f" -> {planned.output}", err=True)
    from kbench.threads import load_line, load_state

    load_before = load_state()
    click.echo(f"kbench: {load_line(load_before)}; {thread_setting.text}", err=True)
    missing = missing_plugins()
    if missing and resume is None:
        click.echo(f"kbench: not installed here (the light install): {'; '.join(missing)}; their backends are not in "
                   "this run (pip install -e plugins/NAME, or pip install -r requirements.txt for all)", err=True)
    show_bar = sys.stderr.isatty() if progress is None else progress
    # a log (`> log`, CI, nohup) gets a line per finished record while the run goes on: stdout before the table
    # (--format table), stderr with --progress (CSV or JSON on stdout stays clean)
    lines = None
    if progress is not False and fmt == "table" and not sys.stdout.isatty():
        lines = _progress_lines(sys.stdout, left)
    elif progress and not sys.stderr.isatty():
        lines = _progress_lines(sys.stderr, left)
    try:
        writer = (_run_with_progress(pm, planned, left, existing, lines) if show_bar
                  else run_suite(pm, planned, existing=existing, on_record=lines))
    except RunInterrupted as exc:
        click.echo(f"\nkbench: {exc.how}; the records so far are in {planned.output} (marked incomplete); "
                   f"finish with: kbench run --resume {planned.output}", err=True)
        sys.exit(143 if "SIGTERM" in exc.how else 130)
    finally:
        if lines is not None:
            lines.stop()
    from kbench.threads import stamp_result

    stamp_result(planned.output, thread_setting, load_before, load_state())
    least = planned.plan.timing.min_samples
    click.echo(records_table(writer.records, fmt, min_samples=least))
    click.echo(f"\n{status_summary(writer.records, least)}; results in {planned.output}", err=True)
    from kbench.run.executors import placement_note, profiles_note

    for note in (placement_note(writer.records), profiles_note(writer.records)):
        if note:
            click.echo(f"kbench: {note}", err=True)
    hint = traceback_hint(writer.records, planned.output)
    if hint:
        click.echo(hint, err=True)
    if not writer.data["complete"]:  # records the environment spoiled: exit 2, the file waits for --resume
        from kbench.results import unmeasured_note

        raise BadInput(unmeasured_note(writer.records) or str(writer.data["interrupted"]), file=str(planned.output),
                       fix=f"fix the environment as the records' reasons say, then: kbench run --resume {planned.output}")
    sys.exit(exit_code(writer.records))


#: the first-party plugins (plugins/), what each adds to a run, and its heavy library (README "Set-up")
FIRST_PARTY = (("kbench-torch", "torch SDPA, decode and varlen backends; torch"),
               ("kbench-triton", "our Triton kernels; triton"),
               ("kbench-cuda", "the cuda device and the cupy backend; cupy"),
               ("kbench-ray", "the ray executor; ray"))


def missing_plugins() -> list[str]:
    """The first-party plugins that are not installed, each with what it would add."""
    import importlib.metadata as md

    missing = []
    for name, adds in FIRST_PARTY:
        try:
            md.version(name)
        except md.PackageNotFoundError:
            missing.append(f"{name} ({adds})")
    return missing


def _executor_settings(opts) -> dict[str, str]:
    from kbench.errors import BadInput

    settings = {}
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--executor-opt {opt!r} is not KEY=VALUE", where="--executor-opt",
                           fix="e.g. --executor-opt resource=gpu_slot")
        settings[key.strip()] = value.strip()
    return settings


#: seconds without a finished record after which the log gets a "still measuring" line
HEARTBEAT = 30.0


class _ProgressLines:
    """``on_record`` writing one flushed line per finished record to ``stream``, for a log (`kbench run ... > log`,
    CI, nohup): ``[ 12/84 1:05] numpy-flash attention[...] passed 1.2 ms``, a failure with its reason; and after
    :data:`HEARTBEAT` seconds without one, ``[ 12/84 2:05] still measuring (60 s since the last record)``. Skipped
    records get no line each: one line per skipped backend, with the count and the reason, when the run ends."""

    def __init__(self, stream, total: int) -> None:
        import threading
        import time

        self.stream, self.total, self.width = stream, total, len(str(total))
        self.start = self.last_record = self.last_line = time.monotonic()
        self.done, self.lock, self.stopped = 0, threading.Lock(), threading.Event()
        from kbench.tables import SkippedTally

        self.skipped = SkippedTally()
        threading.Thread(target=self._beat, name="kbench-progress", daemon=True).start()

    def _write(self, text: str) -> None:
        import time

        elapsed = int(time.monotonic() - self.start)
        with self.lock:
            self.stream.write(f"[{self.done:>{self.width}}/{self.total} {elapsed // 60}:{elapsed % 60:02d}] {text}\n")
            self.stream.flush()

    def __call__(self, rec, i, n) -> None:
        import time

        from kbench.record import Record
        from kbench.tables import fmt_time
        from kbench.text import safe_text

        r = Record.of(rec)
        self.done, self.total = i, n
        self.last_record = time.monotonic()
        if r.status == "skipped":  # counted, summed up per backend at the end
            self.skipped.add(safe_text(str(rec.get("backend"))), safe_text(str(r.reason or "no reason"))[:200])
            return
        self.last_line = self.last_record
        what = f"passed {fmt_time(r.median)}".rstrip() if r.passed else safe_text(r.status_text)[:200]
        self._write(f"{safe_text(str(rec.get('backend')))} {safe_text(str(rec.get('case_id')))} {what}")

    def _beat(self) -> None:
        import time

        while not self.stopped.wait(min(HEARTBEAT / 3, 5.0)):
            now = time.monotonic()
            if now - self.last_line >= HEARTBEAT:
                self.last_line = now
                self._write(f"still measuring ({int(now - self.last_record)} s since the last record)")

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            for line in self.skipped.lines():
                self._write(line)


def _progress_lines(stream, total: int) -> _ProgressLines:
    return _ProgressLines(stream, total)


def _run_with_progress(pm, planned, total, existing=(), lines=None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from kbench.run.runner import run_suite

    # time left from the pace of the records so far (over the whole run: a backend skipped on every case
    # finishes its records at once, a measured one takes its time limit, and the order mixes them)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[last]}"))
    from rich.console import Console

    # on stderr, with the other messages: stdout holds only the table (`--format csv > file`)
    with Progress(*columns, console=Console(stderr=True), transient=False, speed_estimate_period=3600.0) as bar:
        task = bar.add_task("measuring", total=total, last="")

        def on_record(rec, i, n):
            bar.update(task, completed=i, last=f"{rec['backend']} {rec['status']}")
            if lines is not None:
                lines(rec, i, n)
        return run_suite(pm, planned, on_record=on_record, existing=existing)
