"""kbench report: the HTML page holds every plot and table, is well-formed HTML, and PNGs are written."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner
from synthetic_results import H100, lognormal, record, result, write

from kbench.cli import cli

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class TagChecker(HTMLParser):
    """Records every problem with nesting: a close tag that does not match the open one, or unclosed tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.counts: dict[str, int] = {}
        self.ids: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        self.ids.update(v for k, v in attrs if k == "id")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}> "
                                 f"at {self.getpos()}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> TagChecker:
    checker = TagChecker()
    checker.feed(html)
    checker.close()
    assert html.startswith("<!DOCTYPE html>")
    assert not checker.problems, checker.problems[:5]
    assert not checker.stack, f"unclosed: {checker.stack}"
    return checker


def sweep(hardware=None, slow=1.0, seed=0):
    """Two backends over seqlen 64..256, head_dim 32/64, causal and not: 24 records."""
    recs = []
    for d in (32, 64):
        for causal in (False, True):
            for i, s in enumerate((64, 128, 256)):
                params = {"seqlen": s, "heads": 2, "head_dim": d, "causal": causal}
                t = 2e-5 * (s / 64) ** 2 * d / 32
                recs.append(record("numpy", params, lognormal(t, 0.02, 40, seed + i), hardware=hardware))
                recs.append(record("numpy-flash", params, lognormal(1.2 * slow * t, 0.05, 40, seed + 50 + i),
                                   hardware=hardware))
    return result(recs, hardware=hardware, name="sweep")


@pytest.fixture
def runner():
    return CliRunner()


def report(runner, *args):
    res = runner.invoke(cli, ["report", *map(str, args)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


def test_html_report_has_every_plot_and_table(runner, tmp_path):
    src = write(tmp_path / "sweep.json", sweep(hardware=H100))
    out = tmp_path / "report.html"
    res = report(runner, src, "-o", out)
    assert "4 plots" in res.output
    html = out.read_text()
    page = parse(html)
    assert page.counts["svg"] == 4                       # throughput, speedup, roofline, noise
    assert {"throughput", "speedup", "roofline", "noise", "speedup-table", "records-sweep", "machine"} <= page.ids
    # one throughput panel per head_dim x causal, text kept as text in the SVG
    for title in ("head_dim 32, non-causal", "head_dim 32, causal", "head_dim 64, non-causal", "head_dim 64, causal"):
        assert title in html
    # the roofline draws the profile's roofs and no "missing peaks" note
    assert "datasheet fp32 roof" in html and "roofs not drawn" not in html
    # tables: every record, the geomean rows per group, the AVO-style summary
    assert page.counts["table"] >= 2
    assert html.count("<tr class=\"passed\">") == 24
    assert "geomean d=64,causal,hq=2,hkv=2,fp32 (3 cases)" in html
    assert re.search(r"numpy-flash vs numpy: -1[67]\.\d%", html)  # 1/1.2 - 1 = -16.7%
    # machine and environment
    assert "cpu-test-2c" in html and "NVIDIA H100 SXM" in html and "989 TFLOP/s" in html
    # self-contained: nothing fetched
    assert not re.search(r"""(src|href)=["']https?://""", html)


def test_report_without_peaks_says_so_on_the_roofline(runner, tmp_path):
    src = write(tmp_path / "cpu.json", sweep(hardware=None))
    out = tmp_path / "r.html"
    report(runner, src, "-o", out)
    html = out.read_text()
    parse(html)
    assert "roofs not drawn" in html and "kbench calibrate" in html


def test_report_draws_measured_roofs(runner, tmp_path):
    hw = {**H100, "measured_flops": {"fp32": 50e12}, "measured_bandwidth": 3.0e12, "measured_source": "calibrate"}
    src = write(tmp_path / "m.json", sweep(hardware=hw))
    out = tmp_path / "r.html"
    report(runner, src, "-o", out)
    html = out.read_text()
    assert "measured fp32 roof" in html and "datasheet fp32 roof" in html


def test_two_runs_get_a_changes_table(runner, tmp_path):
    a = write(tmp_path / "before.json", sweep(seed=0))
    b = write(tmp_path / "after.json", sweep(slow=1.5, seed=7))
    out = tmp_path / "r.html"
    report(runner, a, b, "-o", out)
    html = out.read_text()
    page = parse(html)
    assert {"changes-after", "records-before", "records-after"} <= page.ids
    assert html.count('<tr class="slower">') == 12 and html.count('<tr class="same">') == 12
    assert "numpy-flash @ after" in html   # runs are separate series in the plots


def test_nothing_passed_gives_valid_page_with_reasons(runner, tmp_path):
    recs = [record("numpy", {"seqlen": 64, "heads": 2, "head_dim": 32}, None, status="skipped", reason="no GPU")]
    src = write(tmp_path / "skip.json", result(recs))
    out = tmp_path / "r.html"
    res = report(runner, src, "-o", out)
    assert "0 plots" in res.output
    html = out.read_text()
    page = parse(html)
    assert page.counts.get("svg", 0) == 0 and html.count("No plot:") == 4


def test_energy_figure_plots_joules_and_tflops_per_watt():
    """Records with the energy a device measured (``telemetry.energy``): joules per call on the left, TFLOP/s per
    watt on the right; none measured, no figure."""
    from kbench.report import figures

    params = {"seqlen": 128, "heads": 2, "head_dim": 32}
    rec = record("numpy", params, lognormal(1e-3, 0.02, 20, 0))
    # a 2 s loop of 200 calls, 300 J: 150 W average, 1.5 J per call
    rec["telemetry"] = {"energy": {"calls": 200, "seconds": 2.0, "source": "nvml energy counter", "energy_j": 300.0,
                                   "average_w": 150.0, "joules_per_call": 1.5, "method": "sustained loop"}}
    plain = record("numpy-flash", params, lognormal(1e-3, 0.02, 20, 1))
    fig = figures.energy([{"series": "numpy", "rec": rec}, {"series": "numpy-flash", "rec": plain}],
                         {"numpy": "#123456", "numpy-flash": "#654321"})
    left, right = fig.axes
    assert len(left.lines) == len(right.lines) == 1  # the record without energy draws nothing
    assert list(left.lines[0].get_ydata()) == [pytest.approx(1.5)]
    assert list(right.lines[0].get_ydata()) == [pytest.approx(rec["metrics"]["tflops"] / 150)]
    assert figures.energy([{"series": "numpy-flash", "rec": plain}], {"numpy-flash": "#000000"}) is None


def test_png_format_writes_one_image_per_plot(runner, tmp_path):
    src = write(tmp_path / "sweep.json", sweep(hardware=H100))
    res = report(runner, src, "--format", "png", "-o", tmp_path / "img", "--baseline", "numpy-flash")
    names = sorted(p.name for p in (tmp_path / "img").iterdir())
    assert names == ["noise.png", "roofline.png", "speedup.png", "throughput.png"]
    for p in (tmp_path / "img").iterdir():
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "speedup.png" in res.output


def test_report_bad_baseline_is_bad_input(runner, tmp_path):
    src = write(tmp_path / "sweep.json", sweep())
    res = runner.invoke(cli, ["report", src, "--baseline", "cudnn", "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "cudnn" in res.output and "numpy, numpy-flash" in res.output


def test_decode_result_splits_query_tokens_into_lines(runner, tmp_path):
    # decode_attention has no causal parameter and several seqlen_q at one cache length
    recs = []
    for i, (sq, sk) in enumerate((sq, sk) for sq in (1, 4) for sk in (1024, 4096)):
        params = {"seqlen_q": sq, "seqlen_kv": sk, "heads_q": 8, "heads_kv": 2, "head_dim": 64}
        recs.append(record("numpy", params, lognormal(1e-5 * sk / 1024 * sq, 0.02, 30, i), op="decode_attention"))
    src = write(tmp_path / "decode.json", result(recs, hardware=H100, name="decode"))
    out = tmp_path / "r.html"
    report(runner, src, "-o", out)
    html = out.read_text()
    parse(html)
    svg = html.split('id="throughput"')[1].split("</svg>")[0]
    assert "head_dim 64" in svg and "causal" not in svg
    assert "numpy seqlen_q=1" in svg and "numpy seqlen_q=4" in svg
    assert html.count("decode_attention[b=1,sq=") == 4         # every record in the records table
