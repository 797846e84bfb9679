"""``kbench publish``: the site's pages and data, its links, lineages, and the site opened in headless Chromium."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import history_synthetic as hs
from kbench.cli import cli

REPO = Path(__file__).resolve().parents[1]
#: the committed CPU reference run and the VM's calibration (copied: other runs may sit beside them, git-ignored)
COMMITTED = [REPO / "results" / "cpu-amd-epyc-2c" / "attention-20261129-183310.json",
             REPO / "results" / "cpu-amd-epyc-2c" / "calibration.json"]


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    """The commands keep a cache in the user's cache directory: the tests' own, here."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def page_data(page: Path) -> dict:
    m = re.search(r'<script type="application/json" id="kbench-data">(.*?)</script>', page.read_text(), re.S)
    assert m, f"no data in {page}"
    return json.loads(m.group(1).replace("<\\/", "</"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The committed results plus a generated 30-run history with a step and an environment change."""
    root = tmp_path_factory.mktemp("pub")
    (root / "committed" / "cpu-amd-epyc-2c").mkdir(parents=True)
    for f in COMMITTED:
        shutil.copy(f, root / "committed" / "cpu-amd-epyc-2c" / f.name)
    hs.write_history(root / "results", seed=21, n=30, step_at=18, step=0.06, backends=("numpy", "numpy-flash"),
                     env_change_at=10)
    lineages = root / "evolve"
    _make_lineage(lineages, root / "results" / "cpu-test-2c")
    out = root / "site"
    res = invoke("publish", root / "committed", root / "results", "-o", out, "--lineages", lineages,
                 "--commit-url", "https://example.org/commit/{commit}", "--cache", root / "cache.json")
    assert res.exit_code == 0, res.output
    return out, root


def _make_lineage(workspace: Path, results: Path) -> None:
    """Three versions whose scores are the numpy TFLOP/s of one case in three of the runs (as evolve records them)."""
    from kbench_evolve.store import Lineage

    suite = REPO / "suites" / "smoke.yaml"
    lin = Lineage.create(workspace, "demo", seed=suite, suite_path=str(suite))
    files = sorted(results.glob("*.json"))
    case = "attention[b=1,sq=64,sk=64,hq=4,hkv=4,d=32,noncausal,fp32]"
    for number in (1, 2, 3):
        rec = next(r for r in json.loads(files[number].read_text())["records"]
                   if r["case_id"] == case and r["backend"] == "numpy")
        score = rec["metrics"]["tflops"]
        lin.commit("def attention(q, k, v): ...\n", {"operator": "mutate", "rationale": f"try {number}",
                                                       "scores": {case: score}, "geomean": score,
                                                       "result_files": [str(files[number])]})


def test_site_pages_and_index(site):
    out, _ = site
    for name in ("index.html", "summary.html", "regressions.html", "machine-cpu-test-2c.html",
                 "machine-cpu-amd-epyc-2c.html", "lineage-demo.html", "assets/plotly.min.js", "assets/history.js"):
        assert (out / name).is_file(), name
    index = (out / "index.html").read_text()
    assert 'href="machine-cpu-amd-epyc-2c.html"' in index and 'href="lineage-demo.html"' in index
    # no page refers to anything outside the site but result files and the commit links asked for
    for page in out.glob("*.html"):
        for ref in re.findall(r'(?:src|href)="([^"]+)"', page.read_text()):
            assert not ref.startswith(("http:", "//")), (page.name, ref)


def test_machine_page_data_series_steps_environment_and_links(site):
    out, root = site
    data = page_data(out / "machine-cpu-test-2c.html")
    assert len(data["runs"]) == 30 and len(data["series"]) == 4
    times = [r["time"] for r in data["runs"]]
    assert times == sorted(times)
    assert [e["run"] for e in data["env"]] == [10] and "torch 2.12.1" in data["env"][0]["text"]
    stepped = [s for s in data["series"] if s["steps"]]
    assert [(s["backend"], s["params"]) for s in stepped] == [("numpy", {"dtype": "fp32", "head_dim": 32,
                                                                          "causal": False})]
    (step,) = stepped[0]["steps"]
    assert step["before"] < 18 <= step["after"] and 0.04 < step["size"] < 0.08
    for s in data["series"]:
        assert len(s["x"]) == len(s["m"]) == len(s["lo"]) == len(s["hi"])
        assert all(lo <= m <= hi for lo, m, hi in zip(s["lo"], s["m"], s["hi"]))
    # every point's run links to its result file (relative: works from the file system) and commit
    for run in data["runs"]:
        assert (out / run["file"]).resolve().is_file()
        assert run["commit_url"] == f"https://example.org/commit/{run['commit']}"
    committed = page_data(out / "machine-cpu-amd-epyc-2c.html")
    assert len(committed["runs"]) == 1 and len(committed["series"]) == 84


def test_summary_compares_latest_with_previous_like_kbench_compare(site):
    out, _ = site
    text = (out / "summary.html").read_text()
    assert "suite attention:" in text and "4 pairs:" in text
    assert "one run only" in text  # the committed CPU reference has a single run


def test_regressions_page_lists_the_step(site):
    out, _ = site
    text = html.unescape((out / "regressions.html").read_text())
    assert "slower" in text and hs.fake_commit(17, "cpu-test-2c")[:10] in text


def test_lineage_page_has_versions_in_order_with_bands(site):
    out, _ = site
    data = page_data(out / "lineage-demo.html")
    assert [v["number"] for v in data["versions"]] == [1, 2, 3]
    geo, case = data["series"]
    assert geo["x"] == case["x"] == [1, 2, 3] and geo["m"] == case["m"]
    # the band of each version comes from the confidence interval of its run's median time
    assert all(lo < m < hi for lo, m, hi in zip(case["lo"], case["m"], case["hi"]))


def test_mixed_machines_only_when_asked(tmp_path):
    hs.write_history(tmp_path / "r", seed=2, n=4)
    hs.write_history(tmp_path / "r", seed=3, n=5, machine={"id": "box-b", "device": "cpu", "cpu": "X", "cores": 8})
    assert invoke("publish", tmp_path / "r", "-o", tmp_path / "apart").exit_code == 0
    assert sorted(p.name for p in (tmp_path / "apart").glob("machine-*.html")) == [
        "machine-box-b.html", "machine-cpu-test-2c.html"]
    assert invoke("publish", tmp_path / "r", "-o", tmp_path / "mixed", "--mix-machines").exit_code == 0
    data = page_data(tmp_path / "mixed" / "machine-all_machines.html")
    assert data["mixed"] and len(data["runs"]) == 9


def test_bad_commit_url_is_bad_input(tmp_path):
    hs.write_history(tmp_path / "r", seed=2, n=2)
    res = CliRunner().invoke(cli, ["publish", str(tmp_path / "r"), "-o", str(tmp_path / "s"), "--commit-url", "x"])
    assert res.exit_code == 2 and "{commit}" in res.stderr


# -- a real browser ---------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def open_in_chromium(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and every console message (our pages print none)."""
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
                           "--virtual-time-budget=15000", "--window-size=1400,6000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    return proc.stdout, console


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install -y chromium)")
def test_site_in_headless_chromium_draws_every_chart_without_console_errors(site, tmp_path):
    out, _ = site
    dom, console = open_in_chromium(out / "machine-cpu-test-2c.html", tmp_path)
    assert console == []
    assert dom.count('data-rendered="1"') == 4      # each series' chart was drawn by plotly
    assert dom.count('class="main-svg"') >= 4
    assert "slower +6." in dom or "slower +5." in dom  # the step's label on its chart
    # the x axis is the runs in commit order, labelled by commit
    assert hs.fake_commit(0, "cpu-test-2c")[:7] in dom and "runs in commit order" in dom
    assert "4 of 4 series" in dom
    dom, console = open_in_chromium(out / "lineage-demo.html", tmp_path)
    assert console == [] and dom.count('data-rendered="1"') == 2
    dom, console = open_in_chromium(out / "index.html", tmp_path)
    assert console == [] and "cpu-amd-epyc-2c" in dom


@pytest.mark.slow  # ~5 s: a browser
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install -y chromium)")
def test_a_step_label_is_inside_its_chart_clear_of_the_toolbar(site, tmp_path):
    out, _ = site
    probe = out / "probe.html"
    page = (out / "machine-cpu-test-2c.html").read_text()
    probe.write_text(page.replace("</body>", """<script>
      setTimeout(function () {
        var found = [];
        document.querySelectorAll(".js-plotly-plot").forEach(function (plot) {
          var bar = plot.querySelector(".modebar"), area = plot.querySelector(".nsewdrag");
          plot.querySelectorAll(".annotation").forEach(function (a) {
            var r = a.getBoundingClientRect(), b = bar.getBoundingClientRect(), p = area.getBoundingClientRect();
            found.push({text: a.textContent, underToolbar: r.left < b.right && b.left < r.right &&
                        r.top < b.bottom && b.top < r.bottom, insidePlot: r.top >= p.top && r.bottom <= p.bottom});
          });
        });
        document.body.dataset.labels = JSON.stringify(found);
      }, 3000);
      </script></body>"""))
    try:
        dom, console = open_in_chromium(probe, tmp_path)
    finally:
        probe.unlink()
    labels = json.loads(html.unescape(re.search(r'data-labels="([^"]*)"', dom).group(1)))
    assert labels and all(lb["text"].startswith("slower +") for lb in labels)
    assert not any(lb["underToolbar"] for lb in labels) and all(lb["insidePlot"] for lb in labels)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install -y chromium)")
def test_the_browser_check_sees_a_script_error(site, tmp_path):
    out, _ = site
    broken = out / "broken.html"
    page = (out / "machine-cpu-test-2c.html").read_text()
    broken.write_text(page.replace("</body>", "<script>undefinedFunction();</script></body>"))
    try:
        _, console = open_in_chromium(broken, tmp_path)
    finally:
        broken.unlink()
    assert any("undefinedFunction is not defined" in ln for ln in console)


def test_latest_vs_previous_compares_two_commits_and_pools_reruns_of_one(tmp_path):
    paths = hs.write_history(tmp_path / "r", seed=5, n=4)
    rerun = json.loads(paths[3].read_text())  # the newest run measured the same commit as the one before it
    rerun["environment"]["git_commit"] = hs.fake_commit(2, "cpu-test-2c")
    paths[3].write_text(json.dumps(rerun))
    out = tmp_path / "site"
    assert invoke("publish", tmp_path / "r", "-o", out, "--no-cache", "-j", "1").exit_code == 0
    text = html.unescape((out / "summary.html").read_text())
    assert (f"suite attention: {hs.fake_commit(2, 'cpu-test-2c')[:10]} (2 runs pooled) vs "
            f"{hs.fake_commit(1, 'cpu-test-2c')[:10]} (") in text
    assert "2 pairs:" in text and re.search(r"<th>n *</th>", text)  # samples of each side

    from kbench.history.runs import load_runs
    from kbench.history.site import latest_pair

    runs = load_runs([tmp_path / "r"])
    prev, last = latest_pair(runs)
    assert [r.path for r in prev] == [paths[1]] and [r.path for r in last] == [paths[2], paths[3]]
    same = latest_pair([runs[2], runs[3]])  # one commit only: the newest run against the others
    assert [r.path for r in same[0]] == [paths[2]] and [r.path for r in same[1]] == [paths[3]]


def test_the_summary_holds_a_change_against_the_other_backends_of_the_runs(tmp_path):
    """The summary called two runs of the same code "faster" (0.62, p = 0.0005) when the previous run had met a
    slow machine: every backend of it was slower. Now the control rule of compare judges the summary too: every
    backend moved alike, so the pairs are machine-wide, never "faster"; a backend that moved alone still is."""
    from kbench.stats import summarize

    paths = hs.write_history(tmp_path / "r", seed=8, n=3, backends=("numpy", "numpy-flash", "torch-sdpa"))

    def scale(path, factor, backends):
        data = json.loads(path.read_text())
        for rec in data["records"]:
            if rec["backend"] in backends:
                rec["timing"]["samples"] = [s * factor for s in rec["timing"]["samples"]]
                rec["stats"] = summarize(rec["timing"]["samples"])
        path.write_text(json.dumps(data))

    scale(paths[1], 1.6, ("numpy", "numpy-flash", "torch-sdpa"))  # the previous run met a slow machine
    out = tmp_path / "site"
    assert invoke("publish", tmp_path / "r", "-o", out, "--no-cache", "-j", "1").exit_code == 0
    text = html.unescape((out / "summary.html").read_text())
    assert "6 pairs: 6 machine-wide" in text and "the backends of the run moved alike" in text
    assert ">faster<" not in text and ">slower<" not in text
    # a history where only numpy-flash got slower in the newest run: its pairs are slower, the others the same
    paths = hs.write_history(tmp_path / "alone", seed=9, n=3, backends=("numpy", "numpy-flash", "torch-sdpa"))
    scale(paths[2], 1.5, ("numpy-flash",))
    assert invoke("publish", tmp_path / "alone", "-o", out, "--no-cache", "-j", "1").exit_code == 0
    text = html.unescape((out / "summary.html").read_text())
    assert "machine-wide" not in text
    rows = re.findall(r"<td>(slower|faster|same|ambiguous) *</td><td>([a-z-]+) *</td>", text)
    assert [b for change, b in rows if change == "slower"] == ["numpy-flash", "numpy-flash"]


def test_time_axes_carry_their_unit():
    """Plotly's SI ticks wrote 60 ms as "60m" (minutes?): the time axis has the unit on every tick now."""
    js = (REPO / "kbench" / "history" / "static" / "history.js").read_text()
    assert 'tickformat: "~s", ticksuffix: "s"' in js and '"median time (s)"' not in js
