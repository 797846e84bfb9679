"""The durable queue and archive of evaluations: one SQLite file in WAL mode, written only by the server.

Every accepted evaluation is a row before the client hears its id; a slot claims the next one in a transaction
that bumps its ``attempt`` counter, and finishing is an UPDATE guarded by that attempt, so an evaluation ends
exactly once even when a server is killed mid-run and a new one re-claims what the old one held. At start the
server returns every ``running`` row to the queue (its previous owner is gone); a row that has been claimed
``MAX_ATTEMPTS`` times without finishing (a kernel that takes the server down with it) ends as an error.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

MAX_ATTEMPTS = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    principal TEXT NOT NULL,
    task TEXT NOT NULL,
    source TEXT NOT NULL,
    source_sha TEXT NOT NULL,
    idempotency_key TEXT,
    force INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL,              -- queued, running, done
    attempt INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    cached_from TEXT,
    outcome TEXT,                      -- the stage that decided: passed, limits, static, import, ...
    reward REAL,
    report TEXT                        -- JSON: stages, reward, score, records
);
CREATE UNIQUE INDEX IF NOT EXISTS by_key ON evaluations(principal, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS by_status ON evaluations(status, principal, seq);
CREATE INDEX IF NOT EXISTS by_source ON evaluations(task, source_sha, status);
"""


def source_digest(task: str, source: str) -> str:
    return hashlib.sha256(task.encode() + b"\0" + source.encode("utf-8")).hexdigest()


class Store:
    """Thread-safe access to the database (one connection, a lock: SQLite serialises writers anyway)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a committed row survives a killed process
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        with self.lock:
            self.db.close()

    # -- the queue ---------------------------------------------------------------------------------------

    def recover(self) -> int:
        """At start: rows a dead server held go back to the queue; rows claimed too often end as errors."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            gave_up = self.db.execute("SELECT id, attempt FROM evaluations WHERE status='running' AND attempt>=?",
                                      (MAX_ATTEMPTS,)).fetchall()
            for row in gave_up:
                report = {"status": "done", "outcome": "error", "reward": 0.0,
                          "stages": [{"stage": "server", "ok": False,
                                      "reason": f"the server stopped {row['attempt']} times while evaluating this "
                                                f"kernel; it is not tried again"}]}
                self.db.execute("UPDATE evaluations SET status='done', outcome='error', reward=0, finished=?, "
                                "report=? WHERE id=?", (time.time(), json.dumps(report), row["id"]))
            n = self.db.execute("UPDATE evaluations SET status='queued' WHERE status='running'").rowcount
            self.db.execute("COMMIT")
            return n

    def queued(self) -> int:
        with self.lock:
            return self.db.execute("SELECT COUNT(*) FROM evaluations WHERE status='queued'").fetchone()[0]

    def counts(self) -> dict[str, int]:
        with self.lock:
            rows = self.db.execute("SELECT status, COUNT(*) FROM evaluations GROUP BY status").fetchall()
        return {r[0]: r[1] for r in rows}

    def submit(self, principal: str, task: str, source: str, *, idempotency_key: str | None,
               force: bool) -> tuple[dict[str, Any], bool]:
        """(the evaluation, created?): an idempotency key seen before for this principal returns that one."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                if idempotency_key is not None:
                    row = self.db.execute("SELECT * FROM evaluations WHERE principal=? AND idempotency_key=?",
                                          (principal, idempotency_key)).fetchone()
                    if row is not None:
                        self.db.execute("COMMIT")
                        return dict(row), False
                digest = source_digest(task, source)
                now = time.time()
                ev_id = uuid.uuid4().hex
                cached = None
                if not force:  # the same source for the same task was judged before: its verdict stands
                    cached = self.db.execute(
                        "SELECT id, outcome, reward, report FROM evaluations WHERE task=? AND source_sha=? AND "
                        "status='done' AND cached_from IS NULL AND outcome!='error' ORDER BY seq DESC LIMIT 1",
                        (task, digest)).fetchone()
                if cached is not None:
                    self.db.execute(
                        "INSERT INTO evaluations (id, principal, task, source, source_sha, idempotency_key, force, "
                        "status, created, started, finished, cached_from, outcome, reward, report) "
                        "VALUES (?,?,?,?,?,?,?,'done',?,?,?,?,?,?,?)",
                        (ev_id, principal, task, source, digest, idempotency_key, 0, now, now, now, cached["id"],
                         cached["outcome"], cached["reward"], cached["report"]))
                else:
                    self.db.execute(
                        "INSERT INTO evaluations (id, principal, task, source, source_sha, idempotency_key, force, "
                        "status, created) VALUES (?,?,?,?,?,?,?,'queued',?)",
                        (ev_id, principal, task, source, digest, idempotency_key, int(force), now))
                row = self.db.execute("SELECT * FROM evaluations WHERE id=?", (ev_id,)).fetchone()
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return dict(row), True

    def claim(self, order: list[str]) -> dict[str, Any] | None:
        """The next queued evaluation, fair across principals: the first principal of ``order`` (least
        recently served first) that has one queued gives its oldest; principals not in ``order`` come first."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                heads = self.db.execute("SELECT principal, MIN(seq) AS seq FROM evaluations WHERE status='queued' "
                                        "GROUP BY principal").fetchall()
                if not heads:
                    self.db.execute("COMMIT")
                    return None
                rank = {p: i for i, p in enumerate(order)}
                pick = min(heads, key=lambda r: (rank.get(r["principal"], -1), r["seq"]))
                self.db.execute("UPDATE evaluations SET status='running', attempt=attempt+1, started=? WHERE seq=?",
                                (time.time(), pick["seq"]))
                row = self.db.execute("SELECT * FROM evaluations WHERE seq=?", (pick["seq"],)).fetchone()
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return dict(row)

    def finish(self, ev_id: str, attempt: int, outcome: str, reward: float, report: dict[str, Any]) -> bool:
        """Record the verdict of claim ``attempt``; False (nothing written) when that claim is no longer the
        evaluation's current one or it is already done: an evaluation ends once."""
        with self.lock:
            n = self.db.execute("UPDATE evaluations SET status='done', finished=?, outcome=?, reward=?, report=? "
                                "WHERE id=? AND attempt=? AND status='running'",
                                (time.time(), outcome, reward, json.dumps(report), ev_id, attempt)).rowcount
            return n == 1

    def get_key(self, principal: str, key: str) -> str | None:
        with self.lock:
            row = self.db.execute("SELECT id FROM evaluations WHERE principal=? AND idempotency_key=?",
                                  (principal, key)).fetchone()
        return row[0] if row is not None else None

    def get(self, ev_id: str, principal: str) -> dict[str, Any] | None:
        """The evaluation ``ev_id`` if ``principal`` submitted it, else None (another's id reads as unknown)."""
        with self.lock:
            row = self.db.execute("SELECT * FROM evaluations WHERE id=? AND principal=?",
                                  (ev_id, principal)).fetchone()
        return dict(row) if row is not None else None
