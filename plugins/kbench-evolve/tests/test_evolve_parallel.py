"""`kbench evolve run --parallel N`: candidates screened concurrently, duels and commits one at a time."""
from __future__ import annotations

import itertools
import json
import re

import pytest
from click.testing import CliRunner

from kbench.testing import cli
from kbench.api import load_result


def overlaps(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_two_workers_screen_at_once_and_the_store_stays_consistent(lineage, workspace):
    res = CliRunner().invoke(cli, ["evolve", "run", "t", "--operator", "mutate", "--parallel", "2", "--iterations", "1",
                                   "--max-steps", "4", "--rounds", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    attempts = [a for a in lineage.attempts() if a.get("operator") == "mutate"]  # not the seed's entry
    screened = [a for a in attempts if "screened" in a]
    assert {a["worker"] for a in screened} == {0, 1}, res.output
    # the first candidate of each worker was measured while the other's was: their screening runs overlap
    assert any(overlaps(a["screened"], b["screened"]) for a, b in itertools.combinations(screened, 2)), screened
    # ... and the log says so: both workers' "screening" lines, stamped, before either's "screened"
    lines = res.output.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"\[\d\d:\d\d:\d\d\.\d{3} w[01]\] screening ", line)]
    first_end = next(i for i, line in enumerate(lines) if re.match(r"\[[\d:.]+ w[01]\] screened ", line))
    assert {lines[i].split("]")[0][-2:] for i in starts if i < first_end} == {"w0", "w1"}, res.output

    # the lineage is the single source of truth, whole: versions numbered without gaps, each commit logged once
    # with its version, no candidate settled twice (the in-flight claim kept the workers apart)
    versions = lineage.versions()
    assert [v.number for v in versions] == list(range(1, len(versions) + 1))
    committed = [a for a in attempts if a["outcome"] == "committed"]
    assert sorted(a["version"] for a in committed) == [v.label for v in versions[1:]]  # v1 is the seed
    settled = [a["sha"] for a in attempts if a["outcome"] in ("committed", "rejected")]
    assert len(settled) == len(set(settled))
    assert len(committed) <= 1  # a commit ends the variation: the other worker's candidate is superseded
    state = json.loads((lineage.root / "state.json").read_text())
    assert state["status"] == "finished" and state["spent"]["commits"] == len(committed)
    assert state["options"]["parallel"] == 2 and "variation_workers" not in state
    for a in attempts:
        if a["outcome"] == "superseded":  # screened against a champion that was replaced meanwhile: not dueled
            assert committed and a["parent"] == "v1" and "decision" not in a


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time (pytest-xdist --dist loadgroup)
def test_screenings_on_a_ray_cluster_duels_here(lineage, workspace):
    """--executor ray: screening runs are scheduled on a real local Ray cluster (2 CPUs, a custom resource
    standing in for 2 devices), one device each, so two run at once; every duel run is a local run on the
    lineage's device."""
    ray = pytest.importorskip("ray")
    from kbench_ray.loopback import keep_loopback

    keep_loopback()  # node address 127.0.0.1: the cluster listens on loopback only (docs/scale-out.md)
    ray.init(num_cpus=2, resources={"kdev": 2}, include_dashboard=False, log_to_driver=False,
             logging_level="warning", _node_ip_address="127.0.0.1")
    try:
        res = CliRunner().invoke(cli, ["evolve", "run", "t", "--operator", "mutate", "--parallel", "2",
                                       "--iterations", "1", "--max-steps", "2", "--rounds", "1", "--device", "cpu",
                                       "--executor", "ray", "--executor-opt", "resource=kdev"])
    finally:
        ray.shutdown()
    assert res.exit_code == 0, res.output
    where, screenings = {}, []
    for path in (lineage.root / "runs").glob("*.json"):
        data = load_result(path)
        label = "screen" if "-screen" in path.name else "duel" if "-duel" in path.name else "other"
        where.setdefault(label, set()).add((data.get("executor") or {}).get("name", "local"))
        if label == "screen":
            screenings.append(data)
    assert where["screen"] == {"ray"}, where
    assert where.get("duel") and "ray" not in where["duel"], where  # a candidate got through: its duel ran here
    # each screening held one device: both ran at once, and no job waited for a device the other run held
    # (an actor waiting for one was taken for a hung node after the job timeout, 8 minutes, and its job retried)
    assert len(screenings) == 2 and all(d["executor"]["slots"] == 1 for d in screenings)
    assert not [r["attempts"] for d in screenings for r in d["records"] if r.get("attempts")]
    screened = [a["screened"] for a in lineage.attempts() if "screened" in a]
    assert len(screened) == 2 and overlaps(*screened), screened
    state = json.loads((lineage.root / "state.json").read_text())
    assert state["options"]["executor"] == {"name": "ray", "address": None,
                                            "settings": {"resource": "kdev", "slots": "1"}}
