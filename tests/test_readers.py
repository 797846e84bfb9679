"""The one reader (kbench.reader): every command that reads a result file, a journal, a suite or an evolve lineage
refuses special files by their type, applies the same limits and says the same kind of message (file, place,
fix; exit 2). Each test names the failure it guards against."""
from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import signal
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.errors import BadInput
from kbench.reader import MAX_INT_DIGITS, MAX_ITEMS, MAX_STRING, parse_json, read_bytes, read_json, structure_cost
from kbench.results import ResultWriter, journal_path, load_result
from kbench.suite import load_suite, suite_from_data
from kbench.yamlsource import load_yaml, load_yaml_text

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "results" / "cpu-amd-epyc-2c" / "decode-cpu.json"


@contextlib.contextmanager
def no_hang(seconds: float = 10.0):
    """A read that waits on a FIFO fails the test instead of hanging it."""
    def alarm(signum, frame):
        raise TimeoutError(f"a reader blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def reference() -> dict:
    return json.loads(DECODE.read_text())


# -- special files, refused by their type before anything opens them ------------------------------------------

def special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    sock = tmp_path / "sock.json"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    (tmp_path / "dir.json").mkdir()
    return {"a named pipe (FIFO)": fifo, "a character device (through a link to /dev/zero)": zero,
            "a socket": sock, "a directory": tmp_path / "dir.json"}


def test_special_files_are_refused_by_type_by_every_reader(tmp_path):
    readers = {"result file": load_result, "YAML file": load_suite,
               "JSON file": lambda p: read_json(p), "lineage": lambda p: read_json(p, what="lineage")}
    with no_hang():
        for kind, path in special_files(tmp_path).items():
            for what, read in readers.items():
                with pytest.raises(BadInput) as err:
                    read(path)
                assert err.value.file == str(path) and f"is {kind}" in err.value.message, (what, err.value)
                assert err.value.fix and err.value.exit_code == 2


def test_a_fifo_in_place_of_a_journal_is_refused_not_waited_on(tmp_path):
    path = tmp_path / "r.json"
    w = ResultWriter(path, header())
    w.append(record())  # the run is "killed" here: file and journal stay
    journal_path(path).unlink()
    os.mkfifo(journal_path(path))
    with no_hang(), pytest.raises(BadInput, match="named pipe") as err:
        load_result(path)
    assert err.value.file == str(journal_path(path))


def test_the_size_is_counted_while_reading_not_taken_from_stat():
    # a /proc file reports size 0 and holds hundreds of bytes: a check of st_size alone would read it all
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(BadInput, match="over the limit of 64 bytes"):
        read_bytes("/proc/self/status", limit=64)


def test_commands_refuse_special_files_with_exit_2(tmp_path):
    files = special_files(tmp_path)
    with no_hang(30):
        for path in (files["a named pipe (FIFO)"], files["a character device (through a link to /dev/zero)"]):
            for args in (("show", path), ("compare", path, DECODE), ("report", path, "-o", tmp_path / "r.html"),
                         ("run", path), ("run", "--resume", path)):
                res = invoke(*args)
                assert res.exit_code == 2 and "not a regular file" not in res.output, (args, res.output)
                assert str(path) in res.output and "fix:" in res.output, (args, res.output)


# -- JSON: the limits and the message form -------------------------------------------------------------------

@pytest.mark.parametrize("text, message, where", [
    ('{"a": ' + "9" * 5000 + "}", f"an integer of 5,000 digits (at most {MAX_INT_DIGITS}", "line 1, column 7"),
    ('{"a": 1,\n "b": 1e999}', "1e999 is beyond the range of a number", "line 2, column 7"),
    ('{"a": NaN}', "NaN is not a number JSON allows", "line 1, column 7"),
    ('{"records": [1],\n "records": []}', "the key 'records' appears twice in one object", "line 1, column 2"),
    ("[" * 100 + "]" * 100, "nested more than 64 levels", "[0][0][0]"),
    ("[" * 5000 + "]" * 5000, "nested too deeply", None),
    ('{"hostname": "' + "h" * (MAX_STRING + 1) + '"}', f"a string of {MAX_STRING + 1:,} characters", "hostname"),
    ('{"samples": [' + ",".join(["0.000125"] * (MAX_ITEMS + 1)) + "]}", f"an array of {MAX_ITEMS + 1:,} items",
     "samples"),
    ("[" + ",".join(["{}"] * 3_000_000) + "]", "its structure would take about", None),
    ("# kbench\n\nnot json", "it is not JSON: text that begins with a '#' line", "line 1, column 1"),
    ('{"a": [1, 2', "the file ends early", "line 1, column 12"),
], ids=["digits", "1e999", "NaN", "duplicate-key", "depth", "depth-recursion", "long-string", "long-array",
        "structure", "not-json", "cut-short"])
def test_json_beyond_the_limits_is_bad_input_naming_the_place(text, message, where):
    with pytest.raises(BadInput) as err:
        parse_json(text, file="f.json", fix="give a good file")
    assert message in err.value.message and err.value.file == "f.json" and err.value.fix
    assert err.value.where == where or (where and err.value.where.startswith(where)), err.value.where


def test_real_result_files_are_far_below_the_structure_limit():
    for path in sorted((ROOT / "results").glob("*/*.json")):
        text = path.read_text()
        assert structure_cost(text) < 7 * len(text), path  # refused above 10x


def test_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(DECODE.read_bytes().replace(b'"kbench-result"', b'"kbench-result\xff"', 1))
    with pytest.raises(BadInput, match="byte 0xff at offset") as err:
        load_result(path)
    assert err.value.where.startswith("line 2, column ")


def test_a_readme_given_as_a_result_says_what_to_give_not_to_re_run(tmp_path):
    res = invoke("show", ROOT / "README.md")
    assert res.exit_code == 2 and "not a result file: it is not JSON: text that begins with a '#' line" in res.output
    assert "give a result file written by `kbench run`" in res.output and "re-run" not in res.output
    cut = tmp_path / "cut.json"
    cut.write_text(DECODE.read_text()[:500])  # a real file cut short: that one may be restored or re-run
    res = invoke("show", cut)
    assert res.exit_code == 2 and "the file ends early" in res.output and "restore it" in res.output


# -- the schema to the leaves, duplicates ---------------------------------------------------------------------

@pytest.mark.parametrize("path, value, where", [
    (("hardware", "peak_flops"), "str", "hardware.peak_flops"),
    (("hardware", "capacity"), "lots", "hardware.capacity"),
    (("records", 0, "placement"), [None], "records[0].placement"),
    (("records", 0, "stats", "median"), -1.0, "records[0].stats.median"),
    (("records", 0, "case", "heads_kv"), 0, "records[0].case.heads_kv"),
    (("records", 0, "case", "seqlen_kv"), "8k", "records[0].case.seqlen_kv"),
    (("records", 0, "backend"), "b" * 2000, "records[0].backend"),
    (("records", 0, "telemetry"), {"energy": {"average_w": "hot"}}, "records[0].telemetry.energy.average_w"),
    (("records", 0, "backend_info"), {"tunables": [1, 2]}, "records[0].backend_info.tunables"),
    (("machine", "hostname"), "h" * 300, "machine.hostname"),
])
def test_leaves_readers_compute_with_are_typed(tmp_path, path, value, where):
    data = reference()
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    with pytest.raises(BadInput, match="invalid result file") as err:
        load_result(write(tmp_path / "r.json", data))
    assert err.value.where == where and len(err.value.message) < 400


def test_two_records_of_one_case_and_backend_are_refused(tmp_path):
    data = reference()
    data["records"].append(copy.deepcopy(data["records"][2]))
    with pytest.raises(BadInput, match=r"the same \(case, backend\) as records\[2\]") as err:
        load_result(write(tmp_path / "r.json", data))
    assert err.value.where == f"records[{len(data['records']) - 1}]"


def test_every_reader_command_says_file_place_fix_with_exit_2(tmp_path):
    data = reference()
    data["hardware"]["peak_flops"] = "str"
    bad = write(tmp_path / "bad.json", data)
    (tmp_path / "site").mkdir()
    for args in (("show", bad), ("compare", bad, DECODE), ("compare", DECODE, bad),
                 ("report", bad, "-o", tmp_path / "r.html"), ("run", "--resume", bad),
                 ("plan", "-m", "llama-3.1-8b", "-w", "chat", "--hardware", "cpu", "--results", bad)):
        res = invoke(*args)
        assert res.exit_code == 2, (args, res.output)
        assert f"{bad}: hardware.peak_flops: invalid result file" in res.output and "\n  fix: " in res.output, args


# -- history commands: a damaged file is reported and skipped --------------------------------------------------

def test_one_damaged_file_does_not_abort_regressions_or_publish(tmp_path):
    d = tmp_path / "results" / "m"
    d.mkdir(parents=True)
    (d / "good.json").write_text(DECODE.read_text())
    (d / "bad.json").write_text(DECODE.read_text().replace('"median": ', '"median": 1e999, "x": ', 1))
    os.mkfifo(d / "fifo.json")
    with no_hang(60):
        res = invoke("regressions", tmp_path / "results", "--no-cache")
        assert res.exit_code == 0, res.output
        assert f"kbench: warning: skipped {d / 'bad.json'}: line " in res.output and "1e999" in res.output
        assert f"skipped {d / 'fifo.json'}: is a named pipe" in res.output and "1 runs, 9 series" in res.output
        res = invoke("publish", tmp_path / "results", "-o", tmp_path / "site", "--no-cache")
        assert res.exit_code == 0 and "skipped" in res.output and "1 runs" in res.output, res.output
    (d / "good.json").unlink()
    res = invoke("regressions", tmp_path / "results", "--no-cache")
    assert res.exit_code == 2 and "none of the 2 result files could be read" in res.output


def test_a_damaged_history_cache_is_only_slower(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    (d / "good.json").write_text(DECODE.read_text())
    cache = tmp_path / "cache.json"
    for content in ('{"version": 2, "cases": {}, "runs": {"x": 1}}', "[" * 5000, '{"version": 2, "runs": []}'):
        cache.write_text(content)
        res = invoke("regressions", d, "--cache", cache)
        assert res.exit_code == 0 and "1 runs" in res.output, (content[:30], res.output)


# -- compare -----------------------------------------------------------------------------------------------------

def test_compare_of_two_results_with_nothing_in_common_is_exit_2(tmp_path):
    other = reference()
    for rec in other["records"]:
        rec["backend"] = "other-backend"
    res = invoke("compare", DECODE, write(tmp_path / "other.json", other))
    assert res.exit_code == 2 and "no (case, backend) in common (9 records only in" in res.output


# -- suites and options --------------------------------------------------------------------------------------------

def test_suite_limits_are_the_reader_limits():
    for text, message in (("name: x\ngrid: [{seqlen: " + "9" * 5000 + "}]\n", "an integer of 5,000 digits"),
                          ("name: x\ndescription: '" + "d" * (MAX_STRING + 1) + "'\ngrid: []\n", "a string of"),
                          ("name: x\ngrid:\n  - {1: 32, seqlen: 8, heads: 1, head_dim: 4}\n", "the key 1 is not a name")):
        data, lines = None, None
        with pytest.raises(BadInput, match=message) as err:
            data, lines = load_yaml_text(text, source="s.yaml")
            suite_from_data(data, path="s.yaml", lines=lines)
        assert err.value.file == "s.yaml" and err.value.where


def test_run_options_refused_before_the_run(tmp_path):
    res = invoke("run", "suites/smoke.yaml", "--case-timeout", "nan", "-o", tmp_path / "r.json")
    assert res.exit_code == 2 and "--case-timeout" in res.output and "'nan' is not a finite number" in res.output
    res = invoke("run", "suites/smoke.yaml", "-o", tmp_path / ("a" * 300 + ".json"))
    assert res.exit_code == 2 and "-o: a name of the path is 305 bytes long" in res.output and "fix:" in res.output
    res = invoke("run", "suites/smoke.yaml", "-o", tmp_path / ("a" * 245 + ".json"))  # its .lock would be too long
    assert res.exit_code == 2 and "plus the 14 kbench adds" in res.output


def test_an_os_error_is_said_once():
    from kbench.outputs import output_error

    err = output_error("/x/y.json", OSError(errno.ENOENT, os.strerror(errno.ENOENT)))
    assert err.message == "cannot write: No such file or directory"


# -- helpers ------------------------------------------------------------------------------------------------------

def header():
    return {"id": "t", "machine": {"id": "m1"}, "environment": {"kbench": "0"}, "hardware": None,
            "suite": {"name": "s", "path": None, "data": {"name": "s"}}, "device": "cpu"}


def record(backend="numpy", **extra):
    return {"backend": backend, "op": "attention", "case_id": "attention[x]", "case": {"seqlen_q": 1},
            "device": "cpu", "status": "passed", "reason": None,
            "timing": {"samples": [1e-3, 2e-3], "stop_reason": "noise_target"}, **extra}


def test_evolve_reads_its_lineage_through_the_same_reader(tmp_path):
    from kbench_evolve.store import Lineage, read_jsonl

    root = tmp_path / "ws" / "lin"
    (root / "versions" / "v0001").mkdir(parents=True)
    os.mkfifo(root / "lineage.json")
    (root / "versions" / "v0001" / "version.json").write_text('{"geomean": 1, "geomean": 2}')
    (root / "attempts.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": ')  # a kill mid-append: the torn line is skipped
    lineage = Lineage(root)
    with no_hang(), pytest.raises(BadInput, match="named pipe"):
        lineage.meta  # noqa: B018
    with pytest.raises(BadInput, match="the key 'geomean' appears twice") as err:
        lineage.versions()
    assert err.value.file == str(root / "versions" / "v0001" / "version.json")
    assert read_jsonl(root / "attempts.jsonl") == [{"a": 1}, {"a": 2}]
    os.mkfifo(tmp_path / "suite.yaml")  # `kbench evolve init NAME --suite FIFO` copies the suite first
    with no_hang(), pytest.raises(BadInput, match="named pipe"):
        lineage.adopt_suite(tmp_path / "suite.yaml")


def test_a_backend_setting_given_twice_is_refused():
    res = invoke("run", "suites/smoke.yaml", "-b", "numpy-flash[block_q=16,block_q=32]")
    assert res.exit_code == 2 and "the setting 'block_q' is given twice" in res.output
    data, lines = load_yaml_text("name: x\nbackends: [{name: 'numpy-flash[block_q=16]', tunables: {block_q: 32}}]\n"
                                 "grid: [{seqlen: 8, heads: 1, head_dim: 4}]\n", source="s.yaml")
    suite = suite_from_data(data, path="s.yaml", lines=lines)
    from kbench.plugins import get_plugin_manager

    with pytest.raises(BadInput, match="given twice") as err:
        suite.plan("cpu", get_plugin_manager().registry.op("attention"))
    assert err.value.file == "s.yaml"


def test_a_baseline_table_that_would_be_mostly_empty_is_refused(tmp_path):
    data = reference()  # every record its own case and backend: a table of records^2 cells, almost all empty
    template = data["records"][0]
    data["records"] = [dict(template, backend=f"b{i}", case_id=f"{template['case_id'][:-1]},k={i}]")
                       for i in range(200)]
    path = write(tmp_path / "sparse.json", data)
    res = invoke("compare", path, "--baseline", "b0")
    assert res.exit_code == 2 and "the table would have 40,000 cells for 200 records" in res.output
    res = invoke("compare", path, "--baseline", "nope")
    assert res.exit_code == 2 and "use one of: b0, b1," in res.output and "and 188 more" in res.output


def test_an_unknown_rate_is_left_out_of_the_file_not_written_as_null(tmp_path):
    head = {**header(), "hardware": {"name": "x", "title": "X", "kind": "gpu", "peak_flops": {"fp32": 1e13, "fp4": None},
                                     "measured_flops": {}}}
    w = ResultWriter(tmp_path / "r.json", head)
    w.finish()
    assert load_result(tmp_path / "r.json")["hardware"]["peak_flops"] == {"fp32": 1e13}


def test_a_report_of_more_series_than_can_be_drawn_is_refused_before_drawing(tmp_path):
    data = reference()
    template = data["records"][0]
    data["records"] = [dict(template, backend=f"b{i}") for i in range(101)]
    res = invoke("report", write(tmp_path / "wide.json", data), "-o", tmp_path / "r.html")
    assert res.exit_code == 2 and "the report would draw 101 series" in res.output and "-k" in res.output
    assert not (tmp_path / "r.html").exists()


def test_a_report_of_more_backends_than_colours_is_drawn(tmp_path):
    data = reference()  # 12 backends on one case: 11 speedup bars, more than the palette has colours
    template = data["records"][0]
    data["records"] = [dict(template, backend=f"b{i}") for i in range(12)]
    res = invoke("report", write(tmp_path / "many.json", data), "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output  # was IndexError: the eleventh bar's default colour
    assert "b10" in (tmp_path / "r.html").read_text()


# -- what a refusal quotes, a file written while read, a suite name too long for a file name ------------

def test_a_link_to_proc_self_environ_is_refused_without_quoting_any_of_it(tmp_path):
    link = tmp_path / "env.json"
    link.symlink_to("/proc/self/environ")
    first = Path("/proc/self/environ").read_bytes().split(b"\0")[0].decode(errors="replace")
    res = invoke("show", link)
    assert res.exit_code == 2 and "not a result file: it is not JSON: binary data" in res.output, res.output
    assert first and first[:12] not in res.output and first.split("=")[0] + "=" not in res.output


def test_a_file_that_changes_while_it_is_read_is_not_called_cut_short(tmp_path, monkeypatch):
    import kbench.reader as reader

    path = tmp_path / "r.json"
    path.write_text(DECODE.read_text()[:500])  # what a reader sees of a file another process is still writing
    real = reader.read_text

    def read_then_the_writer_goes_on(*args, **kw):
        text = real(*args, **kw)
        with open(path, "a") as fh:  # the writer appends while the reader parses
            fh.write(DECODE.read_text()[500:])
        return text

    monkeypatch.setattr(reader, "read_text", read_then_the_writer_goes_on)
    with pytest.raises(BadInput) as err:
        read_json(path, what="result file")
    assert err.value.message.startswith("the result file changed while it was read (500 bytes before, ")
    assert "ends early" not in err.value.message and "cut short" not in err.value.message
    assert "nothing is writing it" in err.value.fix


def test_a_5000_character_suite_name_is_refused_by_the_suite_schema_without_quoting_it(tmp_path):
    suite = tmp_path / "long.yaml"
    suite.write_text(f"version: 1\nname: {'a' * 5000}\nbackends: [numpy]\ngrid: [{{seqlen: 64, heads: 2, head_dim: 32}}]\n")
    res = invoke("run", suite, "--no-progress", "-o", tmp_path / "r.json")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "name (line 2)" in res.output and "(5,000 characters) is longer than 128 characters" in res.output
    assert "a" * 100 not in res.output and "result file" not in res.output.split("fix:")[0]
    assert suite_from_data({"name": "n" * 128, "grid": [{"seqlen": 64, "heads": 2, "head_dim": 32}]}).name == "n" * 128
