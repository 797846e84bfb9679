"""Every kbench command that writes a file, pointed at what must never be replaced: prints what happened.

For each writer (run -o, run -o --force, report -o, report --format png -o, fuzz -o, calibrate -o, publish -o,
roofline --plots, plan --plots, evolve init --workspace) and each hostile output path (a device node made here
with mknod from /dev/null's numbers, a named pipe, a Unix socket, a directory, a file under /proc, a dangling
symbolic link), the real CLI runs in a subprocess. A writer passes when it exits 2, prints no traceback, and the
thing at the path is still what it was (same type, inode and device numbers; a dangling link still dangling, its
target not created). Directory writers are also pointed at a directory holding the hostile thing at the name they
write (publish's index.html, the report's first PNG, a lineage's lineage.json...).

    python benchmarks/writers_hostile.py          # the table, then "N replaced, M tracebacks"; exit 1 if any

Needs root only for the device node (mknod); without it the device rows are left out and said so. The device node
is this script's own, in a temporary directory: nothing points at the machine's /dev.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FILE_KINDS = ("device", "fifo", "socket", "directory", "proc", "dangling")
#: the writers of one file: argv with {out} where the output path goes
FILE_WRITERS = {
    "run -o": ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "hq=4 and noncausal", "-o", "{out}"],
    "run -o --force": ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "hq=4 and noncausal", "--force",
                       "-o", "{out}"],
    "report -o": ["report", "{result}", "-o", "{out}"],
    "fuzz -o": ["fuzz", "-b", "numpy", "--budget", "1", "--seed", "1", "-o", "{out}"],
    "calibrate -o": ["calibrate", "--device", "cpu", "--size", "16", "--copy-mb", "1", "--max-time", "0.05",
                     "-o", "{out}"],
}
#: the writers of a directory: argv with {out}, and the name inside it they write first
DIR_WRITERS = {
    "report --format png -o": (["report", "{result}", "--format", "png", "-o", "{out}"], None),
    "publish -o": (["publish", "{results_dir}", "-o", "{out}"], "assets"),
    "roofline --plots": (["roofline", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--context", "8k",
                          "--plots", "{out}"], "roofline-quadrants.png"),
    "plan --plots": (["plan", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--isl", "512", "--osl", "64",
                      "--simulate", "0", "--plots", "{out}"], "plan-pareto.png"),
    "evolve init --workspace": (["evolve", "init", "lin", "--seed", "{seed}", "--suite", "suites/evolve-cpu.yaml",
                                 "--workspace", "{out}"], "lin"),
}


@dataclass
class Outcome:
    writer: str
    kind: str
    exit_code: int
    replaced: bool
    traceback: bool
    message: str


def make(kind: str, path: Path) -> None:
    """Put the hostile thing ``kind`` at ``path``."""
    if kind == "device":
        null = os.stat("/dev/null")
        os.mknod(path, 0o666 | stat.S_IFCHR, null.st_rdev)  # our own node with /dev/null's numbers
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling":
        os.symlink(path.parent / f"{path.name}.missing-target", path)
    else:
        raise ValueError(kind)


def fingerprint(path: Path) -> tuple:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ("absent",)
    extra = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    return (stat.S_IFMT(info.st_mode), info.st_ino, info.st_rdev, extra)


def can_mknod(tmp: Path) -> bool:
    try:
        make("device", tmp / "probe")
    except PermissionError:
        return False
    os.unlink(tmp / "probe")
    return True


def fixtures(tmp: Path) -> dict[str, str]:
    from tests.synthetic_results import record, result, write

    results_dir = tmp / "results"
    results_dir.mkdir()
    rec = record("numpy", {"batch": 1, "seqlen": 64, "heads": 4, "head_dim": 32, "causal": False},
                 [1e-3, 1.1e-3, 0.9e-3])
    res = write(results_dir / "r.json", result([rec]))
    seed = tmp / "seed.py"
    seed.write_text((ROOT / "plugins/kbench-evolve/kbench_evolve/seeds/numpy_attention_seed.py").read_text())
    return {"result": res, "results_dir": str(results_dir), "seed": str(seed)}


def env() -> dict[str, str]:
    plugins = [str(ROOT / "plugins" / p) for p in ("kbench-cuda", "kbench-torch", "kbench-triton", "kbench-evolve",
                                                   "kbench-ray")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *plugins]), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "KBENCH_EVOLVE_HOME": os.environ.get("KBENCH_EVOLVE_HOME", "")}


def attempt(writer: str, argv: list[str], kind: str, out: Path, watched: Path, fill: dict[str, str],
            timeout: float) -> Outcome:
    args = [a.format(out=out, **fill) for a in argv]
    before = fingerprint(watched)
    target_after_dangling = watched.parent / f"{watched.name}.missing-target"
    try:
        proc = subprocess.run([sys.executable, "-c", "from kbench.cli import main; main()", *args], cwd=ROOT,
                              env=env(), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        code, err = proc.returncode, proc.stderr + proc.stdout
    except subprocess.TimeoutExpired as exc:  # a writer that opened a FIFO and waits for a reader
        code, err = -1, f"hung past {timeout:g} s: {exc}"
    replaced = fingerprint(watched) != before or (kind == "dangling" and target_after_dangling.exists())
    last = [line for line in err.strip().splitlines() if line.strip()]
    return Outcome(writer, kind, code, replaced, "Traceback (most recent call last)" in err,
                   (last[0] if last else "")[:110])


def main() -> int:
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="kbench-writers-hostile-") as tmpdir:
        tmp = Path(tmpdir)
        fill = fixtures(tmp)
        kinds = [k for k in FILE_KINDS if k != "device" or can_mknod(tmp)]
        if "device" not in kinds:
            print("no device rows: mknod needs root here")
        n = 0
        for writer, argv in FILE_WRITERS.items():
            for kind in kinds:
                n += 1
                case = tmp / f"case{n}"
                case.mkdir()
                out = Path("/proc/self/kbench-out.json") if kind == "proc" else case / "out.json"
                if kind != "proc":
                    make(kind, out)
                outcomes.append(attempt(writer, argv, kind, out, out, fill, timeout=120))
        for writer, (argv, inner) in DIR_WRITERS.items():
            for kind in kinds:
                n += 1
                case = tmp / f"case{n}"
                case.mkdir()
                if kind == "directory":
                    continue  # a directory is what these write into
                out = Path("/proc/self/kbench-out") if kind == "proc" else case / "out"
                if kind != "proc":
                    make(kind, out)
                outcomes.append(attempt(writer, argv, kind, out, out, fill, timeout=120))
                if inner is None or kind == "proc":
                    continue
                n += 1
                inside = tmp / f"case{n}"
                inside.mkdir()
                (inside / "out").mkdir()
                make(kind, inside / "out" / inner)
                outcomes.append(attempt(writer, argv, f"{kind} inside", inside / "out", inside / "out" / inner, fill,
                                        timeout=120))
    width = max(len(o.writer) for o in outcomes)
    for o in outcomes:
        flags = ("REPLACED " if o.replaced else "") + ("TRACEBACK " if o.traceback else "")
        print(f"{o.writer:<{width}}  {o.kind:<18} exit {o.exit_code:>2}  {flags or 'kept     '} {o.message}")
    replaced = sum(o.replaced for o in outcomes)
    tracebacks = sum(o.traceback for o in outcomes)
    not_two = sum(o.exit_code != 2 for o in outcomes)
    print(f"\n{len(outcomes)} attempts: {replaced} replaced, {tracebacks} tracebacks, {not_two} not exit 2")
    print(json.dumps({"attempts": len(outcomes), "replaced": replaced, "tracebacks": tracebacks,
                      "not_exit_2": not_two}))
    return 1 if replaced or tracebacks or not_two else 0


if __name__ == "__main__":
    sys.exit(main())
