"""Text from outside kbench (a worker's reply, a result file, a kernel file's NAME) reaches records and the screen
as valid text: one escape (kbench.text.safe_text) at the protocol and the reader boundary, and no command dies
printing. On 6cf3c74 a lone surrogate in an exception message or a NAME ended `kbench run` with a traceback
while printing its table, and `show`, `compare` and `report` died on a hand-edited result file."""
from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.protocol import decode_reply, encode_reply
from kbench.reader import parse_json
from kbench.text import safe_strings, safe_text

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_results import lognormal, record, result, write  # noqa: E402

UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_every_unsafe_character_of_this_python_is_escaped_and_nothing_else():
    unsafe = [chr(c) for c in range(0x110000)
              if unicodedata.category(chr(c)) in UNSAFE_CATEGORIES and chr(c) not in "\t\n"]
    text = "".join(unsafe)
    escaped = safe_text(text)
    escaped.encode("utf-8")  # strict: no surrogate is left
    assert all(unicodedata.category(ch) not in UNSAFE_CATEGORIES for ch in escaped)
    assert escaped.count("\\") == len(unsafe)
    # ordinary text of many scripts, tabs, newlines and backslashes is left as it is (the same object)
    plain = "numpy-flash µs ≤ 1e-3 naïve 注意力 👩‍💻\tline\nC:\\path \\ud800 already escaped"
    plain = plain.replace("\u200d", "")  # ZWJ is a format character (escaped); the rest is plain
    assert safe_text(plain) is plain
    assert safe_text(safe_text(text)) == safe_text(text)


def test_surrogates_controls_and_bidi_are_written_as_python_writes_them():
    assert safe_text("a\ud800b") == "a\\ud800b"
    assert safe_text("\x1b[2J\rpassed") == "\\x1b[2J\\x0dpassed"
    assert safe_text("numpy\u202e") == "numpy\\u202e"
    assert safe_text("num\u200bpy") == "num\\u200bpy"
    assert safe_text("\U000e0041") == "\\U000e0041"


def test_a_workers_reply_is_escaped_at_the_protocol_boundary():
    sent = encode_reply(("error", {"reason": "bad \ud800 \x1b[31m", "k\u202e": ["x\ud801", 1.5]}))
    kind, body = decode_reply(sent)
    assert body == {"reason": "bad \\ud800 \\x1b[31m", "k\\u202e": ["x\\ud801", 1.5]}
    json.dumps(body, ensure_ascii=False).encode("utf-8")


def test_a_file_is_escaped_at_the_reader_boundary():
    data = parse_json('{"case_id": "a\\ud800", "k\\u202e": ["\\b", 1, {"x": "\\udfff"}]}', file="f.json")
    assert data == {"case_id": "a\\ud800", "k\\u202e": ["\\x08", 1, {"x": "\\udfff"}]}
    clean = {"records": [{"backend": "numpy", "samples": [1.0, 2.0]}]}
    assert safe_strings(clean) is clean


def _hand_edited(tmp_path: Path, name: str) -> str:
    params = {"batch": 1, "seqlen": 64, "heads": 2, "head_dim": 32, "causal": False, "dtype": "fp32"}
    recs = [record("numpy", params, lognormal(1e-3, 0.05, 20, 1)),
            record("numpy-flash", params, lognormal(2e-3, 0.05, 20, 2))]
    for rec in recs:
        rec["case_id"] = rec["case_id"] + "\ud800\u202e"
    recs[1]["backend"] = "numpy-flash\x1b[2J"
    path = write(tmp_path / name, result(recs))
    assert "\\ud800" in Path(path).read_text()
    return path


def test_show_compare_and_report_print_a_hand_edited_result_file(tmp_path):
    base, new = _hand_edited(tmp_path, "a.json"), _hand_edited(tmp_path, "b.json")
    shown = invoke("show", base)
    assert shown.exit_code == 0, shown.output + repr(shown.exception)
    assert "\\ud800\\u202e" in shown.output and "numpy-flash\\x1b[2J" in shown.output
    compared = invoke("compare", base, new)
    assert compared.exit_code == 0, compared.output + repr(compared.exception)
    assert "\\ud800" in compared.output
    against = invoke("compare", base, "--baseline", "numpy")
    assert against.exit_code == 0, against.output + repr(against.exception)
    out = tmp_path / "report.html"
    reported = invoke("report", base, "-o", out)
    assert reported.exit_code == 0, reported.output + repr(reported.exception)
    assert "\\ud800" in out.read_text(encoding="utf-8")


KERNEL = '''"""Raises with a lone surrogate, a terminal escape and a bidi override in its message."""
NAME = "odd-name"


def attention(q, k, v, out, *, causal, scale):
    print("clear the screen \\x1b[2J\\rpassed", flush=True)
    raise ValueError("bad \\ud800 text \\x1b[31m red \\u202e evil")
'''

SUITE = """version: 1
name: text
op: attention
backends: ["numpy"]
check: {seeds: 1}
timing: {warmup_time: 0.0, min_samples: 3, min_time: 0.0, max_time: 0.05, target_rel_se: 1.0, rotate: 2}
grid:
  - {batch: 1, seqlen: 16, heads: 1, head_dim: 16, causal: false, dtype: fp32}
"""


def test_run_prints_its_table_with_a_surrogate_in_a_name_and_an_exception(tmp_path):
    kernel = tmp_path / "odd.py"
    kernel.write_text(KERNEL)
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    out = tmp_path / "r.json"
    ran = invoke("run", suite, "-b", kernel, "-o", out)
    # exit 1: a record ended with an error (the kernel raised); never a traceback of the parent
    assert ran.exit_code == 1 and isinstance(ran.exception, SystemExit), ran.output + repr(ran.exception)
    assert "odd-name" in ran.output and "bad \\ud800 text \\x1b[31m red \\u202e evil" in ran.output
    rec = json.loads(out.read_text())["records"][0]
    assert rec["backend"] == "odd-name" and "\\ud800" in rec["reason"]
    # what the kernel printed is kept escaped too (the worker's output, read from its pipe)
    assert "clear the screen \\x1b[2J\\x0dpassed" in rec["stderr_tail"] and "\x1b" not in rec["stderr_tail"]
    shown = invoke("show", out)
    assert shown.exit_code == 0 and "odd-name" in shown.output
    # a NAME holding a surrogate is refused (a kernel file's NAME is ASCII), the character shown escaped
    kernel.write_text(KERNEL.replace('NAME = "odd-name"', 'NAME = "odd\\ud800name"'))
    refused = invoke("run", suite, "-b", kernel, "-o", tmp_path / "r2.json")
    assert refused.exit_code == 2 and "odd\\ud800name" in refused.output and "U+D800" in refused.output


def test_a_suite_is_escaped_as_it_is_read():
    from kbench.yamlsource import load_yaml_text

    data, _ = load_yaml_text('name: "fast\\u202e\\x1b[2J"\nbackends: ["numpy\\u200b"]\n')
    assert data == {"name": "fast\\u202e\\x1b[2J", "backends": ["numpy\\u200b"]}
