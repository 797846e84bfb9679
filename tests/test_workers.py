"""Worker processes: isolation, sandbox, crashes and restarts, plugin misbehaviour, the private channel."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from kbench.errors import PluginError
from kbench.plugins import PluginManager
from kbench.run.runner import RunRequest, plan_run, run_suite
from kbench.suite import suite_from_data
from kbench.testing import FunctionBackend, make_case
from kbench.run.pool import WorkerPool, is_secret, worker_environment

REDTEAM = Path(__file__).parent / "redteam"

SUITE = {"name": "w", "grid": [{"seqlen": 16, "heads": 2, "head_dim": 8, "causal": [False, True]}],
         "check": {"seeds": 2},
         "timing": {"warmup_time": 0.0, "min_samples": 3, "min_time": 0.0, "max_time": 0.05, "target_rel_se": 1.0,
                    "rotate": 2}}


def run(tmp_path, *, patterns=(), files=(), pm=None, suite=SUITE, **req):
    pm = pm or PluginManager()
    out = tmp_path / "r.json"
    planned = plan_run(pm, RunRequest(suite=suite_from_data(suite), device="cpu", backend_patterns=list(patterns),
                                      kernel_files=[str(f) for f in files], output=out, **req))
    return run_suite(pm, planned).records


def kernel(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_secrets_are_stripped_from_worker_environments():
    env = worker_environment({"PATH": "/bin", "OPENAI_API_KEY": "x", "GITHUB_TOKEN": "x", "AWS_ACCESS_KEY_ID": "x",
                              "DB_PASSWORD": "x", "MY_SECRET_THING": "x", "KBENCH_PLUGINS": "a"}, scratch="/s")
    assert set(env) >= {"PATH", "KBENCH_PLUGINS", "PYTHONPATH"}
    assert not {k for k in env if is_secret(k)} and "OPENAI_API_KEY" not in env and "AWS_ACCESS_KEY_ID" not in env
    assert env["HOME"] == env["TMPDIR"] == "/s"


def test_untrusted_kernel_runs_sandboxed(tmp_path, monkeypatch):
    monkeypatch.setenv("KBENCH_TEST_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("SOME_TOKEN", "t")
    snoop = kernel(tmp_path, "snoop", '''
        import os, resource
        from kbench.builtin.numpy_backends import attention_numpy
        def attention(q, k, v, out, *, causal, scale):
            leaked = [k for k in os.environ if "API_KEY" in k or "TOKEN" in k]
            if leaked:
                raise RuntimeError(f"secrets visible: {leaked}")
            if not os.getcwd().startswith(os.environ["TMPDIR"]) or "kbench-worker-" not in os.getcwd():
                raise RuntimeError(f"not in a scratch directory: {os.getcwd()}")
            if resource.getrlimit(resource.RLIMIT_AS)[0] != 2 * 2**30:
                raise RuntimeError("no address-space limit")
            if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != 2**20:
                raise RuntimeError("no file-size limit")
            print("a kernel may print to stdout without breaking the channel " * 1000)
            attention_numpy(q, k, v, out, causal=causal, scale=scale)
    ''')
    suite = {**SUITE, "integrity": {"memory_limit": "2GiB", "file_size_limit": "1MiB"}}
    recs = run(tmp_path, files=[snoop], suite=suite)
    assert [r["status"] for r in recs] == ["passed", "passed"], [r["reason"] for r in recs]
    assert all(r["worker"]["sandbox"] and r["worker"]["pid"] != os.getpid() for r in recs)
    assert recs[0]["worker"]["pid"] == recs[1]["worker"]["pid"]  # one long-lived worker per backend


def test_crashed_worker_is_restarted_and_the_run_goes_on(tmp_path):
    recs = run(tmp_path, patterns=["numpy"], files=[REDTEAM / "segfault.py"])
    by = {(r["backend"], r["case_id"]): r for r in recs}
    crashed = [r for r in recs if r["backend"] == "file:segfault"]
    assert [r["status"] for r in crashed] == ["crashed", "crashed"]
    assert crashed[1]["worker"]["starts"] == 2 and crashed[0]["worker"]["pid"] != crashed[1]["worker"]["pid"]
    assert all(r["status"] == "passed" for (b, _), r in by.items() if b == "numpy")


def test_no_isolate_runs_trusted_backends_in_process_but_never_untrusted(tmp_path):
    recs = run(tmp_path, patterns=["numpy"], files=[REDTEAM / "honest_numpy.py"], isolate=False)
    numpy_recs = [r for r in recs if r["backend"] == "numpy"]
    file_recs = [r for r in recs if r["backend"] == "file:honest_numpy"]
    assert all("worker" not in r for r in numpy_recs) and all(r["status"] == "passed" for r in numpy_recs)
    assert all(r["worker"]["sandbox"] and r["status"] == "passed" for r in file_recs)


def test_untrusted_backend_that_cannot_be_rebuilt_is_an_error_not_in_process(kbench_pm):
    ran = []
    backend = FunctionBackend(lambda q, k, v, out, case: ran.append(1), name="closure")
    backend.trusted = False
    planned_ctx = plan_run(kbench_pm, RunRequest(suite=suite_from_data(SUITE), device="cpu",
                                                 backend_patterns=["numpy"])).ctx
    with WorkerPool(kbench_pm, planned_ctx) as pool:
        rec = pool(backend, make_case(kbench_pm))
    assert rec["status"] == "error" and "never runs in the parent" in rec["reason"] and not ran


BAD_PLUGIN = '''
    import time
    import numpy as np
    import kbench
    from kbench.backends import Backend
    from kbench.builtin.numpy_backends import attention_numpy

    class Shape(Backend):
        name = "bad-shape"
        def prepare(self, case):
            return lambda q, k, v, out: np.zeros(out.shape[:-1], out.dtype)

    class DType(Backend):
        name = "bad-dtype"
        def prepare(self, case):
            def run(q, k, v, out):
                res = np.empty(out.shape, np.float64)
                attention_numpy(q, k, v, res, causal=case["causal"], scale=case["head_dim"] ** -0.5)
                return res
            return run

    class Raises(Backend):
        name = "bad-supports"
        def supports(self, case):
            raise KeyError("no idea")
        def prepare(self, case):
            raise AssertionError("never prepared")

    class Hangs(Backend):
        name = "bad-hang"
        def supports(self, case):
            time.sleep(3600)
        def prepare(self, case):
            raise AssertionError("never prepared")

    class Info(Backend):
        name = "bad-info"
        def info(self):
            return {"handle": object(), "nan": float("nan")}
        def prepare(self, case):
            return lambda q, k, v, out: attention_numpy(q, k, v, out, causal=case["causal"],
                                                        scale=case["head_dim"] ** -0.5)

    @kbench.hookimpl
    def kbench_register_backends(registry):
        for cls in (Shape, DType, Raises, Hangs, Info):
            registry.add_backend(cls())
'''


def test_misbehaving_plugin_backends_become_clear_records(tmp_path, monkeypatch):
    (tmp_path / "kbtest_bad_plugin.py").write_text(textwrap.dedent(BAD_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = PluginManager(["kbtest_bad_plugin"])
    recs = run(tmp_path, patterns=["bad-*"], pm=pm, case_timeout=4,
               suite={**SUITE, "grid": [{"seqlen": 16, "heads": 2, "head_dim": 8}]})
    by = {r["backend"]: r for r in recs}
    assert by["bad-shape"]["status"] == "failed" and "output shape" in by["bad-shape"]["reason"]
    assert by["bad-dtype"]["status"] == "failed" and "output dtype" in by["bad-dtype"]["reason"]
    assert by["bad-supports"]["status"] == "error" and "KeyError" in by["bad-supports"]["reason"]
    assert by["bad-hang"]["status"] == "timeout" and "case timeout of 4 s" in by["bad-hang"]["reason"]
    # an unserialisable info() is written as text, the record is kept
    from kbench.results import load_result

    saved = {r["backend"]: r for r in load_result(tmp_path / "r.json")["records"]}
    assert by["bad-info"]["status"] == "passed" and "object" in saved["bad-info"]["backend_info"]["handle"]
    assert saved["bad-info"]["backend_info"]["nan"] is None
    # the worker killed for the hang was replaced: the next backend ran in a new one
    assert by["bad-info"]["worker"]["pid"] != by["bad-hang"]["worker"]["pid"]


def test_registering_twice_names_both_plugins(tmp_path, monkeypatch):
    (tmp_path / "kbtest_twice.py").write_text(textwrap.dedent('''
        import kbench
        from kbench.builtin.numpy_backends import NumpyAttention
        @kbench.hookimpl
        def kbench_register_backends(registry):
            registry.add_backend(NumpyAttention())
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"duplicate backend name 'numpy'") as err:
        PluginManager(["kbtest_twice"])
    assert "'kbtest_twice'" in str(err.value) and "'kbench.builtin.numpy_backends'" in str(err.value)


def test_kernel_file_is_not_imported_in_the_parent(tmp_path, kbench_pm):
    marker = tmp_path / "imported"
    path = kernel(tmp_path, "sneaky", f'''
        """Writes a file when imported."""
        NAME = "sneaky"
        open({str(marker)!r}, "w").write("parent")
        def attention(q, k, v, out, *, causal, scale):
            out[...] = 0
    ''')
    planned = plan_run(kbench_pm, RunRequest(suite=suite_from_data(SUITE), device="cpu", kernel_files=[str(path)],
                                             output=tmp_path / "r.json"))
    assert [b.name for b in planned.backends] == ["sneaky"] and not marker.exists()


def test_more_untrusted_backends_than_workers_run_backend_by_backend(tmp_path, monkeypatch):
    import kbench.run.pool

    monkeypatch.setattr(kbench.run.pool, "MAX_WORKERS", 2)
    files = []
    for i in range(3):
        files.append(tmp_path / f"honest{i}.py")
        files[-1].write_text((REDTEAM / "honest_numpy.py").read_text())
    recs = run(tmp_path, patterns=["numpy"], files=files)
    assert len(recs) == 8 and all(r["status"] == "passed" for r in recs)
    order = [r["backend"] for r in recs]
    assert order[:2] == ["numpy", "numpy"]  # trusted first, case-major
    for name in ("file:honest0", "file:honest1", "file:honest2"):  # then each untrusted backend in a row
        at = [i for i, b in enumerate(order) if b == name]
        assert at == list(range(at[0], at[0] + 2))
        assert len({recs[i]["worker"]["pid"] for i in at}) == 1  # one worker for all its cases: no eviction


SEES = '''
import hashlib, json, os, sys

def attention(q, k, v, out, *, causal, scale):
    home = os.environ.get("HOME", "")
    env = sorted((key, value.replace(home, "<scratch>")) for key, value in os.environ.items())
    fds = []
    for n in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink("/proc/self/fd/" + n)
        except OSError:
            target = "?"
        fds.append([int(n), target.split(":")[0].split("[")[0]])
    seen = {"argv": sys.argv, "fds": fds, "cwd": os.getcwd().replace(home, "<scratch>"),
            "env": hashlib.sha256(json.dumps(env).encode()).hexdigest()[:16], "env_keys": [k for k, _ in env]}
    raise RuntimeError("SEEN " + json.dumps(seen))
'''


def test_held_out_and_scoring_workers_look_the_same_from_inside(tmp_path):
    """What a kernel can see of its worker (argv, environment, open descriptors and their numbers, working
    directory) is the same in a scoring run and in a correctness-only (held-out, fuzz) check made while the parent
    holds other descriptors: before, the channel's number in argv was the parent's (4 in one, 6 or 7 in the other)."""
    import json
    import re

    from kbench.fuzz.checker import Checker
    from kbench.kernelfile import KernelFileRef

    probe = kernel(tmp_path, "sees", SEES)
    scoring = run(tmp_path, files=[probe])[0]
    pm = PluginManager()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]   # the parent's state differs
    try:
        with Checker(pm, "attention") as checker:
            checked = checker.check(KernelFileRef(probe, pm.registry), make_case(pm, "attention", seqlen=16))
    finally:
        for fd in held:
            os.close(fd)
    seen = [json.loads(re.search(r"SEEN (\{.*\})", rec["reason"]).group(1)) for rec in (scoring, checked)]
    assert seen[0]["argv"][-1] == "0"
    assert seen[0] == seen[1], seen
