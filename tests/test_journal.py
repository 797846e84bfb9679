"""Result writing through the journal: linear in the run, crash-safe, folded into the file at the end and on read."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from kbench import results
from kbench.errors import BadInput
from kbench.outputs import journal_path, release_result_lock
from kbench.results import JournalNote, ResultWriter, load_result, results_root


def header():
    return {"id": "t", "machine": {"id": "m1"}, "environment": {"kbench": "0"}, "hardware": None,
            "suite": {"name": "s", "path": None, "data": {"name": "s"}}, "device": "cpu"}


def record(i, samples=4):
    return {"backend": f"b{i}", "op": "attention", "case_id": f"attention[{i}]", "case": {"seqlen_q": i + 1},
            "device": "cpu", "status": "passed", "reason": None,
            "timing": {"samples": [1e-3 + k * 1e-7 for k in range(samples)], "stop_reason": "time_limit"}}


def raw_records(path):
    return json.loads(path.read_text())["records"]


def journal_lines(path):
    return journal_path(path).read_bytes().splitlines()


def journaled(path, n):
    """A writer of ``path`` with ``n`` records in its journal (no checkpoint yet)."""
    w = ResultWriter(path, header(), checkpoint_records=1000, checkpoint_seconds=1e9)
    for i in range(n):
        w.append(record(i))
    return w


def test_records_go_to_the_journal_and_the_file_at_checkpoints(tmp_path):
    path = tmp_path / "r.json"
    w = ResultWriter(path, header(), checkpoint_records=2, checkpoint_seconds=1e9)
    w.append(record(0))
    assert raw_records(path) == [] and len(journal_lines(path)) == 2  # the journal's first line and one record
    assert [r["backend"] for r in load_result(path)["records"]] == ["b0"]
    w.append(record(1))  # a checkpoint: the file holds both, the journal starts again
    assert [r["backend"] for r in raw_records(path)] == ["b0", "b1"] and len(journal_lines(path)) == 1
    w.append(record(2))
    assert len(raw_records(path)) == 2 and [r["backend"] for r in load_result(path)["records"]] == ["b0", "b1", "b2"]
    w.finish()
    assert not journal_path(path).exists()
    data = load_result(path)
    assert data["complete"] is True and [r["backend"] for r in data["records"]] == ["b0", "b1", "b2"]
    assert raw_records(path) == data["records"]


def test_rewrites_add_up_to_a_few_times_the_final_file(tmp_path, monkeypatch):
    """The old writer rewrote the whole file per record (n^2/2 records written); checkpoints at doubling counts
    write at most about twice the final file in all."""
    real, rewritten = results.atomic_write_json, []

    def counting(path, data):
        rewritten.append(len(data["records"]))
        real(path, data)

    monkeypatch.setattr(results, "atomic_write_json", counting)
    n = 300
    w = ResultWriter(tmp_path / "r.json", header(), checkpoint_records=4, checkpoint_seconds=1e9)
    for i in range(n):
        w.append(record(i))
    w.finish()
    assert rewritten[-1] == n
    assert sum(rewritten) <= 3 * n  # quadratic writing would be ~n^2/2 = 45,000 records
    assert len(rewritten) <= 12  # start, 4, 8, 16, ... 256, finish


def test_a_checkpoint_is_written_after_checkpoint_seconds(tmp_path):
    path = tmp_path / "r.json"
    w = ResultWriter(path, header(), checkpoint_records=1000, checkpoint_seconds=1.0)
    w.append(record(0))
    assert raw_records(path) == []
    time.sleep(1.05)
    w.append(record(1))  # more than checkpoint_seconds since the last rewrite: the file shows progress
    assert len(raw_records(path)) == 2
    w.finish()


def test_a_crash_between_a_checkpoint_and_the_new_journal_duplicates_nothing(tmp_path):
    path = tmp_path / "r.json"
    w = journaled(path, 3)
    results.atomic_write_json(path, w.data)  # the rewrite happened, the journal was not restarted yet
    w.append(record(3))
    assert [r["backend"] for r in load_result(path)["records"]] == ["b0", "b1", "b2", "b3"]
    w.finish()


def test_a_torn_last_line_is_ignored_with_a_note(tmp_path):
    path = tmp_path / "r.json"
    journaled(path, 2)
    jp = journal_path(path)
    jp.write_bytes(jp.read_bytes()[:-40])  # the second record cut short, as a kill while writing it leaves it
    with pytest.warns(JournalNote, match="cut short"):
        data = load_result(path)
    assert [r["backend"] for r in data["records"]] == ["b0"] and data["complete"] is False
    release_result_lock(path)


def test_a_damaged_line_before_the_last_is_bad_input_naming_the_journal_line(tmp_path):
    path = tmp_path / "r.json"
    journaled(path, 3)
    jp = journal_path(path)
    lines = jp.read_bytes().split(b"\n")
    lines[2] = lines[2][:30]
    jp.write_bytes(b"\n".join(lines))
    with pytest.raises(BadInput, match="not valid JSON") as err:
        load_result(path)
    assert err.value.file == str(jp) and err.value.where.startswith("line 3, column ")
    release_result_lock(path)


def test_a_journal_left_by_another_writer_of_the_path_is_ignored(tmp_path):
    path = tmp_path / "r.json"
    journaled(path, 1)
    stale = journal_path(path).read_bytes()
    release_result_lock(path)  # the old run was killed
    new = ResultWriter(path, header())  # e.g. --force: a new run on the same path, no records yet
    journal_path(path).write_bytes(stale)  # as if killed between writing the file and starting its journal
    assert load_result(path)["records"] == []
    new.finish()


def test_resume_folds_the_journal_and_starts_a_new_one(tmp_path):
    path = tmp_path / "r.json"
    journaled(path, 2)
    release_result_lock(path)  # killed: no finish
    kept = load_result(path)
    again = ResultWriter(path, {k: v for k, v in kept.items() if k != "records"}, kept["records"])
    assert kept["journal"] != again.data["journal"]
    assert len(raw_records(path)) == 2 and len(journal_lines(path)) == 1  # folded into the file
    again.append(record(2))
    again.finish()
    assert [r["backend"] for r in load_result(path)["records"]] == ["b0", "b1", "b2"]


WRITER = textwrap.dedent("""
    import sys
    from kbench.results import ResultWriter
    sys.path.insert(0, {tests!r})
    from test_journal import header, record

    w = ResultWriter({path!r}, header(), checkpoint_records=3, checkpoint_seconds=1e9)
    for i in range(10_000):
        w.append(record(i, samples=3000))  # about 60 KB a line, as a GPU record with thousands of samples
        print(i + 1, flush=True)
    """)


@pytest.mark.parametrize("trial", range(4))
def test_kill_9_of_a_real_writer_loses_at_most_the_record_being_written(tmp_path, trial):
    path = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(tests=os.path.dirname(__file__), path=str(path))],
                            stdout=subprocess.PIPE, text=True)
    rng = random.Random(trial)
    wanted = rng.randint(3, 40)  # before, at and between checkpoints (3, 6, 12, 24, ...)
    acked = 0
    while acked < wanted:
        line = proc.stdout.readline()
        assert line, "the writer died"
        acked = int(line)
    time.sleep(rng.random() * 0.05)  # somewhere inside a later append
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    acked = max(acked, *(int(x) for x in proc.stdout.read().split() or [0]))
    with warnings.catch_warnings():  # a torn last line may be there or not, depending on where the kill landed
        warnings.simplefilter("ignore", JournalNote)
        data = load_result(path)
    n = len(data["records"])
    assert acked <= n <= acked + 1  # everything acknowledged, and at most the one being written beyond it
    assert [r["backend"] for r in data["records"]] == [f"b{i}" for i in range(n)]
    assert data["complete"] is False
    # resume: a new writer with the kept records finishes the file with all of them and no journal
    again = ResultWriter(path, {k: v for k, v in data.items() if k != "records"}, data["records"])
    again.append(record(n))
    again.finish()
    assert [r["backend"] for r in load_result(path)["records"]] == [f"b{i}" for i in range(n + 1)]
    assert not journal_path(path).exists()


def test_results_root(monkeypatch, tmp_path):
    monkeypatch.delenv("KBENCH_RESULTS", raising=False)
    assert str(results_root()) == "results"
    monkeypatch.setenv("KBENCH_RESULTS", str(tmp_path))
    assert results_root() == tmp_path


def test_a_full_disk_says_so_in_the_file_it_stopped(tmp_path, monkeypatch):
    """The journal's last block takes one more short line even when the disk is full: readers show why the
    run stopped (``interrupted``) instead of "still running or killed"."""
    import errno

    path = tmp_path / "r.json"
    w = ResultWriter(path, header())
    w.append(record(0))
    real = results.journal_write

    def full(fd, data):
        if b'"record"' in data:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(results, "journal_write", full)
    with pytest.raises(BadInput, match="the disk is full"):
        w.append(record(1))
    release_result_lock(path)
    data = load_result(path)
    assert data["complete"] is False and data["interrupted"] == "cannot write the result file: the disk is full"
    assert [r["backend"] for r in data["records"]] == ["b0"]


def test_a_signal_while_the_file_is_finished_waits_for_it(tmp_path, monkeypatch):
    """SIGTERM during the last rewrite: the rewrite completes, then the handler that was there runs."""
    path = tmp_path / "r.json"
    w = ResultWriter(path, header())
    w.append(record(0))
    real = results.atomic_write_json
    seen = []

    def write_then_signal(target, data):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the final write
        real(target, data)

    def handler(signum, frame):
        seen.append(json.loads(path.read_text())["complete"])
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        monkeypatch.setattr(results, "atomic_write_json", write_then_signal)
        with pytest.raises(KeyboardInterrupt):
            w.finish()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert seen == [True]  # the handler ran once, after the file was complete
    assert load_result(path)["complete"] is True and not journal_path(path).exists()
