"""kbench report: the HTML page holds every plot and table, is well-formed HTML, and PNGs are written."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape as html_unescape
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
    text = html.replace("<wbr>", "")  # break opportunities inside long case ids
    assert "geomean d=64,causal,hq=2,hkv=2,fp32 (3 cases)" in text
    assert re.search(r"numpy-flash vs numpy: 1\.[12]\dx slower", text)  # times 1.2 apart: an x-ratio, not -16.7%
    # the records table: samples and why sampling stopped
    records = text.split('id="records-sweep"')[1].split("</table>")[0]
    assert "<th>n</th><th>stop</th>" in records and records.count('<td class="num">40</td>') == 24
    assert records.count("<td>time_limit</td>") == 24
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
    # and the records table says why its roof column is empty and what fills it
    assert "roof: empty, the hardware profile has no peak figures for these records; `kbench calibrate` " \
           "measures them on this machine" in html


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
    assert html.replace("<wbr>", "").count("decode_attention[b=1,sq=") == 4  # every record in the records table


# -- how the plots read --------------------------------------------------------------------------------

def _figures(data, baseline="numpy"):
    from kbench.compare import group_key_for
    from kbench.plugins import PluginManager
    from kbench.report import build_figures, label_runs

    runs = label_runs(["sweep.json"], [data])
    figs, table, _ = build_figures(runs, group_key_for(PluginManager(load_entry_points=False).registry), baseline)
    return figs, table


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_plots_use_log_axes_interval_bars_and_keep_legends_off_the_data():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.container import ErrorbarContainer

    figs, table = _figures(sweep(hardware=H100))
    for name in ("throughput", "speedup", "roofline"):
        fig = figs.items[name][2]
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert fig.legends and all(ax.get_legend() is None for ax in axes), name
        legend = fig.legends[0].get_window_extent(renderer)
        assert not any(_overlaps(legend, ax.get_window_extent(renderer)) for ax in axes), name
    throughput = [ax for ax in figs.items["throughput"][2].axes if ax.get_visible()]
    assert len(throughput) == 4 and all(ax.get_yscale() == "log" and ax.get_xscale() == "log" for ax in throughput)
    # every line carries the 95% interval of its median time, as a rate
    bars = [c for ax in throughput for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 8 and all(c.has_yerr for c in bars)
    rec = sweep(hardware=H100)["records"][0]
    ys = [ax for ax in throughput if ax.get_title() == "head_dim 32, non-causal"][0]
    segs = [seg for c in ys.containers if isinstance(c, ErrorbarContainer) for seg in c.lines[2][0].get_segments()]
    tf, med = rec["metrics"]["tflops"], rec["stats"]["median"]
    expected = (tf * med / rec["stats"]["ci_high"], tf * med / rec["stats"]["ci_low"])
    assert any(seg[0][1] == pytest.approx(expected[0]) and seg[1][1] == pytest.approx(expected[1]) for seg in segs)
    # the speedup bars start at 1x on a log-ratio axis: 1.2x slower and 1.2x faster are bars of one length
    (ax,) = figs.items["speedup"][2].axes
    assert ax.get_xscale() == "log"
    bars = [p for p in ax.patches if p.get_width() != 0]
    assert bars and all(p.get_x() == pytest.approx(1.0) for p in bars)
    speedups = sorted(s.speedup for s in table.cells.values() if s.speedup)
    assert speedups[0] == pytest.approx(1 / 1.2, rel=0.08)   # numpy-flash is 1.2x slower
    assert "1x" in [t.get_text() for t in ax.get_xticklabels()]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.slow  # ~8 s: a browser
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install -y chromium)")
def test_the_page_fits_a_1400_pixel_window_in_a_browser(runner, tmp_path):
    """No horizontal scrollbar, on the page or on a table, with the widest tables kbench writes: a GPU run's
    records with energy columns and long backend names, and a speedup table of five backends."""
    energy = {"average_w": 150.0, "joules_per_call": 1.5, "kernel_fraction": 0.25, "source": "nvml energy counter"}
    recs = []
    for i, name in enumerate(("cudnn", "torch-sdpa-cudnn", "torch-sdpa-flash", "triton",
                              "triton-hopper[WARP_SPECIALIZE=0]", "flash-attn3")):
        for j, causal in enumerate((False, True)):
            params = {"batch": 1, "seqlen": 16384, "heads": 16, "head_dim": 128, "causal": causal, "dtype": "bf16"}
            rec = record(name, params, lognormal(3e-3 * (1 + i / 5), 0.01, 2, 10 * i + j), hardware=H100)
            rec["telemetry"] = {"energy": energy}
            recs.append(rec)
    recs.append(record("flash-attn", params, None, status="failed",
                       reason="relative L2 error 0.0986 exceeds the bf16 bound 0.01 on trial 0"))
    src = write(tmp_path / "wide.json", result(recs, hardware=H100, name="wide"))
    page = tmp_path / "r.html"
    report(runner, src, "-o", page)
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", """<script>
      const wide = [...document.querySelectorAll('.scroll')].filter(e => e.scrollWidth > e.clientWidth + 1)
        .map(e => e.closest('section').id);
      document.body.dataset.fit = JSON.stringify({page: document.documentElement.scrollWidth,
                                                  view: document.documentElement.clientWidth, wide});
      </script></body>"""))
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000", "--dump-dom",
                           probe.as_uri()], capture_output=True, text=True, timeout=120)
    fit = json.loads(html_unescape(re.search(r'data-fit="([^"]*)"', proc.stdout).group(1)))
    assert fit["page"] <= fit["view"] and fit["wide"] == [], fit


# -- plots that read right -------------------------------------------------------------------------

def _throughput_axes(data):
    figs, _ = _figures(data)
    fig = figs.items["throughput"][2]
    return fig, [ax for ax in fig.axes if ax.get_visible()]


def _visible_y_ticks(ax, fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    lo, hi = ax.get_ylim()
    return [t for t in ax.yaxis.get_majorticklocs() if lo <= t <= hi]


def test_throughput_lines_join_one_shape_only_and_every_panel_has_two_y_ticks():
    """Cases of different shapes (batch 4 at 256 keys, batch 1 at 1024: the same tokens; 37 queries against
    101 keys beside 64 against 64) were joined into one line as if they were a trend; a panel whose values
    lay between two ticks showed one."""
    recs = []
    for i, (b, s) in enumerate(((4, 256), (2, 512), (1, 1024))):
        recs.append(record("numpy", {"batch": b, "seqlen": s, "heads": 2, "head_dim": 32},
                           lognormal(1e-4 * s / 256, 0.01, 30, i)))
    for i, (sq, sk) in enumerate(((64, 64), (37, 101))):
        recs.append(record("numpy", {"seqlen_q": sq, "seqlen_kv": sk, "heads": 2, "head_dim": 64},
                           lognormal(2.1e-6 * sq * sk / 4096, 0.01, 30, 10 + i)))
    fig, axes = _throughput_axes(result(recs, hardware=H100, name="shapes"))
    for ax in axes:
        assert all(len(line.get_xdata()) == 1 for line in ax.get_lines() if line.get_linestyle() != "None"), \
            ax.get_title()
        assert len(_visible_y_ticks(ax, fig)) >= 2, ax.get_title()
    # one shape at several lengths is still a line
    fig, axes = _throughput_axes(sweep(hardware=H100))
    assert {len(line.get_xdata()) for ax in axes for line in ax.get_lines() if len(line.get_xdata()) > 1} == {3}


def test_a_long_legend_is_cut_to_series_and_styles():
    """Four backends in five configurations were 20 legend entries (17 on the reference run)."""
    from kbench.report.figures import LEGEND_MAX

    recs = []
    for b in ("numpy", "numpy-flash", "torch-sdpa", "cupy"):
        for j, dtype in enumerate(("fp32", "fp16", "bf16")):
            for hkv in (2, 4) if dtype != "fp32" else (4,):
                for s in (64, 128):
                    params = {"seqlen": s, "heads_q": 4, "heads_kv": hkv, "head_dim": 32, "dtype": dtype}
                    recs.append(record(b, params, lognormal(1e-4 * s / 64, 0.01, 20, j * 10 + s)))
    fig, _ = _throughput_axes(result(recs, hardware=H100, name="many"))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) <= LEGEND_MAX and {"numpy", "numpy-flash", "torch-sdpa", "cupy"} <= set(labels)
    assert sum("dtype=" in t for t in labels) == 5


def test_roofline_points_of_several_series_at_one_place_stay_visible():
    params = {"seqlen": 128, "heads": 2, "head_dim": 32}
    samples = lognormal(1e-4, 0.001, 20, 1)
    data = result([record("numpy", params, samples, hardware=H100), record("numpy-flash", params, samples,
                                                                           hardware=H100)], hardware=H100, name="same")
    figs, _ = _figures(data)
    (ax,) = figs.items["roofline"][2].axes
    points = [c for c in ax.collections if len(c.get_offsets())]
    assert len(points) == 2
    first, second = points
    assert first.get_sizes()[0] > second.get_sizes()[0]  # the one drawn first is larger: both show
    assert first.get_paths()[0].vertices.shape != second.get_paths()[0].vertices.shape  # different markers
    assert first.get_facecolors()[0][3] < 1  # a translucent fill


def test_a_long_error_is_cut_in_the_status_column_and_given_whole_under_the_table(runner, tmp_path):
    params = {"seqlen": 64, "heads": 2, "head_dim": 32}
    message = "Traceback (most recent call last): " + "frame " * 60 + "ValueError: the kernel wrote NaN"
    data = result([record("numpy", params, lognormal(1e-4, 0.01, 20, 1)),
                   record("numpy-flash", params, None, status="error", reason=message)], hardware=H100, name="err")
    out = tmp_path / "r.html"
    report(runner, write(tmp_path / "err.json", data), "-o", out)
    html = html_unescape(out.read_text().replace("<wbr>", ""))
    row = next(r for r in html.split("<tr") if "numpy-flash" in r and "<td" in r)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert max(len(c) for c in cells) < 100 and any(c.endswith("[1]") for c in cells)
    assert message in html  # whole, in the list under the table
