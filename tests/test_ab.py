"""kbench ab: old and new in one run, rounds paired back to back at random, the paired verdict and its gate."""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from synthetic_results import record

from kbench.ab import (DEFAULT_ROUNDS, FAILING, SAME, SLOWER, UNDECIDED, judge, order_interval, paired_logs,
                       round_samples)
from kbench.cli import cli
from kbench.record import Record

SMOKE = "suites/smoke.yaml"
ONE_CASE = "d=64 and fp16"  # one case of the smoke suite (a tenth of its records)
PARAMS = [{"seqlen": 32 * (c + 1), "heads": 2, "head_dim": 32} for c in range(3)]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def rounds_record(backend, params, per_round):
    """A passed record measured in rounds: ``per_round`` lists of samples, pooled as kbench.run.rounds pools them."""
    rec = record(backend, params, [s for r in per_round for s in r])
    rec["timing"]["rounds"] = [{"samples": len(r), "pooled": len(r), "median": float(np.median(r))}
                               for r in per_round]
    return Record.from_json(rec)


def sides(factor, *, rounds=DEFAULT_ROUNDS, seed=0, outliers=(), params=PARAMS):
    """OLD and NEW records of ``params``, NEW ``factor`` times slower; each round's level jitters 5% (both sides
    alike: one moment of the machine) and each sample 2%; rounds in ``outliers`` find NEW's side in a slow moment
    (every sample 3x)."""
    rng = np.random.default_rng(seed)
    recs = []
    for p in params:
        base = rng.uniform(1e-4, 1e-3)
        old, new = [], []
        for k in range(rounds):
            level = base * math.exp(rng.normal(0, 0.05))
            old.append(list(level * np.exp(np.abs(rng.normal(0, 0.02, 20)))))
            slow = 3.0 if k in outliers else 1.0
            new.append(list(level * factor * slow * np.exp(np.abs(rng.normal(0, 0.02, 20)))))
        recs += [rounds_record("old:k", p, old), rounds_record("new:k", p, new)]
    return recs


def by_case(recs):
    return lambda r: f"d={r.case['head_dim']}"


# -- the statistics ---------------------------------------------------------------------------------

def test_rounds_split_back_from_the_pooled_samples_and_pair_by_round():
    old = rounds_record("old:k", PARAMS[0], [[1.0, 2.0], [3.0, 4.0, 5.0]])
    new = rounds_record("new:k", PARAMS[0], [[2.0, 4.0], [6.0, 9.0, 12.0]])
    assert round_samples(old) == [[1.0, 2.0], [3.0, 4.0, 5.0]]
    # the fastest samples of each round: 2/1, then 6/3
    assert paired_logs(old, new) == pytest.approx([math.log(2.0), math.log(2.0)])


def test_the_sign_test_interval_drops_the_extreme_rounds_at_the_coverage_asked():
    logs = [math.log(x) for x in (1.2, 1.25, 1.24, 1.26, 1.22, 3.0, 0.4, 1.25, 1.23, 1.27)]
    iv = order_interval(logs, 0.95)
    # ten rounds: the 2nd smallest to the 2nd largest, covering the median with 1 - 2 * 11/1024
    assert iv.coverage == pytest.approx(1 - 2 * 11 / 1024)
    assert iv.low == pytest.approx(1.2) and iv.high == pytest.approx(1.27) and iv.n == 10
    # three rounds cannot reach 95% (their widest interval covers 75%)
    assert order_interval(logs[:3], 0.95).coverage == pytest.approx(0.75)


@pytest.mark.parametrize("factor,want", [(1.25, SLOWER), (1.0, SAME)])
def test_a_slower_new_is_slower_and_same_code_is_same_even_with_a_slow_round(factor, want):
    """Round levels jitter 5% (both sides alike); one round in ten finds NEW in a 3x slow moment. The paired ratio
    cancels the jitter and the sign-test interval leaves the slow round out: 1.25x is slower on every case, group
    and overall, same code is same, and the gate fails only on the first."""
    recs = sides(factor, outliers=(3,))
    v = judge(recs, "old:k", "new:k", lambda r: f"s={r.case['seqlen_q'] % 64}", threshold=1.05)
    assert [c.verdict for c in v.cases] == [want] * 3
    assert all(c.interval.ratio == pytest.approx(factor, rel=0.03) for c in v.cases)
    assert [g.verdict for g in v.groups] == [want] * 2 and v.overall.verdict == want
    assert bool(v.regressed) == (want == SLOWER)


def test_too_few_rounds_or_a_failing_new_are_said_so():
    few = judge(sides(1.5, rounds=3), "old:k", "new:k", by_case(None))
    assert all(c.verdict == UNDECIDED and "cannot give a 95% interval" in c.note for c in few.cases)
    assert not few.regressed  # undecided never fails the gate
    recs = sides(1.0)
    broken = Record.from_json(record("new:k", PARAMS[0], None, status="failed", reason="wrong output"))
    recs = [r for r in recs if not (r.backend == "new:k" and r.case_id == broken.case_id)] + [broken]
    v = judge(recs, "old:k", "new:k", by_case(None))
    failing = [c for c in v.cases if c.case_id == broken.case_id]
    assert failing[0].verdict == FAILING and "wrong output" in failing[0].note
    assert any("failing" in r for r in v.regressed)


def test_bad_threshold_and_confidence_are_bad_input():
    from kbench.errors import BadInput

    with pytest.raises(BadInput, match="threshold"):
        judge(sides(1.0), "old:k", "new:k", by_case(None), threshold=0.9)
    with pytest.raises(BadInput, match="confidence"):
        judge(sides(1.0), "old:k", "new:k", by_case(None), confidence=1.5)


# -- real runs --------------------------------------------------------------------------------------

def test_ab_of_two_backends_pairs_the_rounds_back_to_back_and_judges_them(tmp_path):
    """A real run of numpy against numpy-flash on one smoke case, 6 rounds: every round of the case runs OLD and
    NEW one right after the other (in a random order), the records carry their 6 rounds, the result names the
    sides and the seed, and the verdict JSON gives 6 paired ratios with an interval."""
    from kbench.ab import run_ab
    from kbench.plugins import get_plugin_manager
    from kbench.suite import load_suite

    pm = get_plugin_manager()
    run = run_ab(pm, load_suite(SMOKE), "numpy", "numpy-flash", rounds=6, keyword=ONE_CASE,
                 output=tmp_path / "ab.json", seed=7)
    assert [s.backend.name for s in run.sides] == ["numpy", "numpy-flash"]
    assert len(run.started) == 12
    for i in range(0, 12, 2):  # each (case, round) twice in a row: its two sides, back to back
        (c1, k1, b1), (c2, k2, b2) = run.started[i], run.started[i + 1]
        assert (c1, k1) == (c2, k2) and {b1, b2} == {"numpy", "numpy-flash"}
    firsts = [run.started[i][2] for i in range(0, 12, 2)]
    assert [run.started[i][1] for i in range(0, 12, 2)] == [1, 2, 3, 4, 5, 6]
    assert len(set(firsts)) == 2  # the order within pairs is drawn: seed 7 puts each side first at least once
    assert all(len(r.timing["rounds"]) == 6 for r in run.records)
    data = json.loads((tmp_path / "ab.json").read_text())
    assert data["ab"]["seed"] == 7 and data["ab"]["old"]["backend"] == "numpy"

    res = invoke("ab", SMOKE, "numpy", "numpy", "-k", ONE_CASE, "--rounds", "6", "-o", tmp_path / "aa.json",
                 "--format", "json", "--seed", "1")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    # the same backend on both sides (an A/A check) runs as two copies
    assert out["old"]["backend"] == "old:numpy" and out["new"]["backend"] == "new:numpy"
    (case,) = out["cases"]
    assert len(case["round_ratios"]) == 6 and case["ci_low"] <= case["ratio"] <= case["ci_high"]
    assert case["coverage"] == pytest.approx(1 - 2 / 64)


def test_the_gate_fails_beyond_the_threshold_and_passes_within_it(tmp_path):
    """numpy-flash is about twice numpy's time on this case (measured, any load): --fail-on-regression 1%
    fails naming the case, --fail-on-regression 900% (a ratio of 10) passes the same kind of run."""
    res = invoke("ab", SMOKE, "numpy", "numpy-flash", "-k", ONE_CASE, "--rounds", "6", "-o", tmp_path / "a.json",
                 "--fail-on-regression", "1%")
    assert res.exit_code == 1, res.output
    assert "slower than OLD beyond 1.01" in res.stderr and "attention[b=2" in res.stderr
    assert "sign-test interval" in res.stdout and "+ " in res.stdout
    res = invoke("ab", SMOKE, "numpy", "numpy-flash", "-k", ONE_CASE, "--rounds", "6", "-o", tmp_path / "b.json",
                 "--fail-on-regression", "900%")
    assert res.exit_code == 0, res.output + res.stderr


def test_bad_sides_are_bad_input(tmp_path):
    res = CliRunner().invoke(cli, ["ab", SMOKE, "numpy", "no-such-backend*", "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "NEW" in res.stderr and "names 0 backends" in res.stderr
    res = CliRunner().invoke(cli, ["ab", SMOKE, "numpy", "numpy", "--rounds", "1"])
    assert res.exit_code == 2
    res = CliRunner().invoke(cli, ["ab", SMOKE, "no-such-rev-xyz:kernel.py", "numpy"])
    assert res.exit_code == 2 and "not a commit" in res.stderr


KERNEL = '''"""NumPy attention for the A/B revision test."""
import numpy as np

SUBSTRATE = "numpy"
OP = "attention"
NAME = "revk"


def attention(q, k, v, out, *, causal, scale):
    sk, sq = k.shape[1], q.shape[1]
    group = q.shape[2] // k.shape[2]
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            s = (q[b, :, h].astype(np.float32) @ k[b, :, h // group].astype(np.float32).T) * np.float32(scale)
            if causal:
                s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, :, h] = (p / p.sum(axis=1, keepdims=True)) @ v[b, :, h // group].astype(np.float32)
'''


def test_a_kernel_file_at_a_git_revision_is_checked_out_into_a_scratch_worktree(tmp_path, monkeypatch):
    """OLD as REV:PATH: the file as committed, from a scratch `git worktree` that is gone afterwards; NEW the
    working copy (edited since). Both run, named old:revk and new:revk."""
    from kbench.ab import run_ab
    from kbench.plugins import get_plugin_manager
    from kbench.suite import load_suite

    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "k.py").write_text(KERNEL)

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "kernel")
    (repo / "kernels" / "k.py").write_text(KERNEL.replace("NumPy attention", "NumPy attention, edited"))
    suite = load_suite(SMOKE)
    monkeypatch.chdir(repo / "kernels")
    run = run_ab(get_plugin_manager(), suite, "HEAD:k.py", "k.py", rounds=2, keyword=ONE_CASE,
                 output=tmp_path / "rev.json")
    assert run.old.backend.name == "old:revk" and run.new.backend.name == "new:revk"
    assert run.old.origin.startswith("kernel file k.py at HEAD (") and "edited" not in run.old.backend.source_text
    assert all(r.passed for r in run.records), [r.status_text for r in run.records]
    assert git("worktree", "list").count("\n") == 1  # the scratch worktree was removed
