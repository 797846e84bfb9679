"""The HTTP edge against hostile clients: each refusal has its status, and nothing reaches the queue.

In-process (FastAPI's TestClient, the slots stopped: nothing is evaluated) except where a real socket is
the point (a slow body, the listening addresses, the command line's address checks).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from serve_support import TOKENS, auth, kernel, write_tasks
from kbench_serve.app import Settings, create_app, read_tokens
from kbench_serve.tasks import load_tasks

from kbench.api import BadInput


@pytest.fixture
def make_client(tmp_path):
    tasks = load_tasks(write_tasks(tmp_path / "tasks"))

    def make(**kw) -> TestClient:
        settings = Settings(db=str(tmp_path / f"db-{len(os.listdir(tmp_path))}.sqlite"),
                            tokens={t: n for n, t in TOKENS.items()}, **kw)
        return TestClient(create_app(tasks, settings, start=False))

    return make


def body(source: str = "def attention(q, k, v, out, *, causal, scale):\n    out[...] = 0\n", **kw):
    return {"task": "tiny", "source": source, **kw}


def test_missing_and_wrong_tokens_are_refused_and_a_token_sees_only_its_own(make_client):
    with make_client() as c:
        assert c.post("/v1/evaluations", json=body()).status_code == 401
        r = c.post("/v1/evaluations", json=body(), headers={"Authorization": "Bearer not-a-token-of-this-server"})
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert c.get("/v1/tasks").status_code == 401
        mine = c.post("/v1/evaluations", json=body(), headers=auth("alice"))
        assert mine.status_code == 202
        ev = mine.json()["id"]
        assert c.get(f"/v1/evaluations/{ev}", headers=auth("alice")).json()["status"] == "queued"
        # another token's id reads exactly as an unknown one
        other = c.get(f"/v1/evaluations/{ev}", headers=auth("bob"))
        unknown = c.get("/v1/evaluations/0123456789abcdef", headers=auth("bob"))
        assert other.status_code == unknown.status_code == 404
        assert c.get("/v1/tasks", headers=auth("bob")).json()[0]["id"] == "tiny"


def test_bodies_over_the_limit_get_413_declared_or_streamed(make_client):
    with make_client(max_body=4096) as c:
        r = c.post("/v1/evaluations", json=body("x" * 5000), headers=auth("alice"))
        assert r.status_code == 413 and "4096" in r.json()["detail"]

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b"a" * 1000

        r = c.post("/v1/evaluations", content=chunks(), headers={**auth("alice"), "content-type": "application/json"})
        assert r.status_code == 413
        assert c.get("/healthz").json()["queued"] == 0


def test_a_source_over_the_tasks_limit_is_refused_by_the_limits_stage(tmp_path):
    from kbench_serve.cascade import evaluate

    task = load_tasks(write_tasks(tmp_path / "tasks"))["tiny"]
    outcome, reward, report = evaluate(task, "#" * (task.max_source_bytes + 1))
    assert (outcome, reward) == ("limits", 0.0)
    assert "over this task's limit" in report["stages"][0]["reason"]
    assert [s["stage"] for s in report["stages"]] == ["limits", "reward"]


def test_malformed_json_lone_surrogates_and_bad_utf8_are_clean_4xx(make_client):
    with make_client() as c:
        h = {**auth("alice"), "content-type": "application/json"}
        for raw in (b'{"task": ', b"[1, 2", b'{"task": "tiny", "source": 5}', b"null", b"\xff\xfe{}"):
            r = c.post("/v1/evaluations", content=raw, headers=h)
            assert r.status_code in (400, 422), (raw, r.status_code)
            assert "detail" in r.json()
        r = c.post("/v1/evaluations", content=b'{"task": "tiny", "source": "def f():\\n  return \\"\\ud800\\""}',
                   headers=h)
        assert r.status_code == 422  # refused where the string is read: the source field names it
        assert r.json()["detail"][0]["loc"] == ["body", "source"]
        r = c.post("/v1/evaluations", json=body(), headers={**auth("alice")}, params={"wait": "-1"})
        assert r.status_code == 422
        assert c.get("/healthz").json()["queued"] == 0


def test_a_full_queue_answers_429_with_retry_after(make_client):
    with make_client(max_queue=5) as c:
        ids = [c.post("/v1/evaluations", json=body(f"# {i}\n" + kernel("honest_numpy")), headers=auth("alice"))
               for i in range(5)]
        assert [r.status_code for r in ids] == [202] * 5
        r = c.post("/v1/evaluations", json=body("# six\n" + kernel("honest_numpy")), headers=auth("bob"))
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        # a replay of an accepted evaluation is not a new one: it is answered even with the queue full
        key = c.post("/v1/evaluations", json=body("# k", idempotency_key="k1"), headers=auth("bob"))
        assert key.status_code == 429
        metrics = c.get("/metrics").text
        assert 'kbench_serve_refused_total{why="queue"} 2.0' in metrics
        assert "kbench_serve_queue_depth 5.0" in metrics


def test_idempotent_resubmission_returns_the_same_evaluation(make_client):
    with make_client() as c:
        a = c.post("/v1/evaluations", json=body(idempotency_key="same"), headers=auth("alice"))
        b = c.post("/v1/evaluations", json=body(idempotency_key="same"), headers=auth("alice"))
        assert a.status_code == 202 and b.status_code == 200 and b.headers["Idempotent-Replay"] == "true"
        assert a.json()["id"] == b.json()["id"]
        other = c.post("/v1/evaluations", json=body(idempotency_key="same"), headers=auth("bob"))
        assert other.json()["id"] != a.json()["id"]  # keys are per token
        assert c.get("/healthz").json()["queued"] == 2


def test_per_token_rate_limit(make_client):
    with make_client(rate=0.5, burst=3) as c:
        codes = [c.post("/v1/evaluations", json=body(f"# {i}"), headers=auth("alice")).status_code for i in range(4)]
        assert codes == [202, 202, 202, 429]
        assert c.post("/v1/evaluations", json=body("# b"), headers=auth("bob")).status_code == 202  # bob's own budget


def test_the_client_waits_out_a_429_and_retries_under_the_same_key(make_client):
    from kbench_serve.client import Client

    with make_client(rate=1.0, burst=1) as c:
        client = Client(token=TOKENS["alice"], http=c, backoff=0.01)
        first = client.submit("tiny", "# one\n" + kernel("honest_numpy"), idempotency_key="one")
        t0 = time.monotonic()
        second = client.submit("tiny", "# two\n" + kernel("honest_numpy"), idempotency_key="two")
        assert time.monotonic() - t0 >= 0.9  # Retry-After: 1 was honoured, not the 0.01 s backoff
        assert first["id"] != second["id"]
        assert client.submit("tiny", "# two\n", idempotency_key="two")["id"] == second["id"]  # a replay
        assert c.get("/healthz").json()["queued"] == 2


def test_openapi_is_served_and_names_the_routes(make_client):
    with make_client() as c:
        spec = c.get("/openapi.json").json()
        assert {"/v1/evaluations", "/v1/evaluations/{ev_id}", "/v1/tasks", "/healthz", "/metrics"} <= set(spec["paths"])


def test_tokens_from_a_file_and_the_environment(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# comment\ncarol:carol-token-0123456789\nbare-token-0123456789abc\n")
    tokens = read_tokens(str(f), env="dave:dave-token-0123456789")
    assert tokens["carol-token-0123456789"] == "carol" and tokens["dave-token-0123456789"] == "dave"
    assert tokens["bare-token-0123456789abc"].startswith("t-")  # named by its hash, never stored itself
    f.write_text("short\n")
    with pytest.raises(BadInput, match="at least 16 characters"):
        read_tokens(str(f), env="")


def test_a_bad_task_file_names_the_file_the_place_and_the_fix(tmp_path):
    folder = write_tasks(tmp_path / "tasks")
    (folder / "tiny.yaml").write_text((folder / "tiny.yaml").read_text().replace("held_out: 0", "held_out: many"))
    with pytest.raises(BadInput) as err:
        load_tasks(folder)
    text = err.value.format()
    assert "tiny.yaml" in text and "line 5" in text and "'many' is not of type 'integer'" in text and "fix:" in text
    (folder / "tiny.yaml").write_text((folder / "tiny.yaml").read_text().replace("held_out: many", "held_out: 0")
                                      .replace("baseline: numpy-flash", "baseline: nope"))
    with pytest.raises(BadInput, match="no backend of op 'attention' is called 'nope'"):
        load_tasks(folder)


def test_the_example_task_loads_and_shows_clients_nothing_held_out():
    from serve_support import ROOT

    task = load_tasks(ROOT / "examples" / "rl-loop" / "tasks")["attention-tiny"]
    assert (task.baseline, task.held_out, task.n_cases) == ("numpy-flash", 3, 1)
    public = task.public()
    assert public["held_out"] == "checked (hidden)" and "suite" not in public and "seqlen" not in str(public)


def _serve(tmp_path, *args, env=None):
    write_tasks(tmp_path / "tasks")
    return subprocess.run([sys.executable, "-m", "kbench.cli", "serve", "--tasks", str(tmp_path / "tasks"),
                           "--db", str(tmp_path / "x.sqlite"), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KBENCH_SERVE_TOKENS": "", **(env or {})})


def test_other_addresses_need_the_flag_and_tokens(tmp_path):
    r = _serve(tmp_path, "--host", "0.0.0.0")
    assert r.returncode == 2 and "not a loopback address" in r.stderr and "--allow-remote" in r.stderr
    r = _serve(tmp_path, "--host", "0.0.0.0", "--allow-remote")
    assert r.returncode == 2 and "needs bearer tokens" in r.stderr


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (each thread's children file)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def listening_addresses(pid: int) -> set[str]:
    """The local addresses of every listening TCP socket of ``pid``'s process tree (/proc/net/tcp{,6})."""
    inodes = set()
    for p in _tree(pid):
        for fd in Path(f"/proc/{p}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            words = [raw[i:i + 4][::-1] for i in range(0, len(raw), 4)]  # little-endian 32-bit words
            found.add(str(ipaddress.ip_address(b"".join(words))))
    return found


def test_slow_bodies_are_timed_out_and_the_server_listens_on_loopback_only(server_factory):
    server = server_factory("--body-timeout", "1").start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/evaluations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"task\"")
        t0 = time.monotonic()
        reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
        assert 0.8 <= time.monotonic() - t0 < 8
    assert listening_addresses(server.proc.pid) == {"127.0.0.1"}


def test_the_socket_scan_sees_a_wildcard_listener():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        assert "0.0.0.0" in listening_addresses(os.getpid())


@pytest.mark.slow
def test_ten_thousand_queued_requests_then_429_with_memory_bounded(make_client):
    import resource

    source = kernel("honest_numpy") + "#" * 20_000 + "\n"  # 21 KB each: 210 MB if the queue lived in memory
    with make_client(max_queue=10_000, rate=1e6, burst=10_000_000) as c:
        for i in range(200):  # warm: the allocator's first pools, FastAPI's first routes
            c.post("/v1/evaluations", json=body(f"# warm {i}\n" + source), headers=auth("alice"))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for i in range(200, 10_000):
            r = c.post("/v1/evaluations", json=body(f"# {i}\n" + source), headers=auth("alice"))
            assert r.status_code == 202, (i, r.status_code)
        r = c.post("/v1/evaluations", json=body("# over\n" + source), headers=auth("bob"))
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        # the 9,800 sources (about 205 MB) live in SQLite, not in the process
        assert grew_kib < 48 * 1024, grew_kib
        assert c.get("/healthz").json()["queued"] == 10_000
