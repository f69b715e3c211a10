"""Suggested translations (POST /suggest, off unless NMT_SUGGESTIONS is set), kept in one SQLite
file for the operator to read: what users think the model should have said."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """CREATE TABLE IF NOT EXISTS suggestions (
    q TEXT NOT NULL,
    s TEXT NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    created REAL NOT NULL
)"""


class SuggestionsFull(Exception):
    """The file holds its most bytes of suggestions; the message says so."""


class SuggestionStore:
    """The suggestions' file, holding at most `max_bytes` of their texts (UTF-8; 0: no limit), so
    that clients cannot fill the disk."""

    def __init__(self, path: str | Path, max_bytes: int = 0):
        self.path, self.max_bytes = Path(path), max_bytes
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._bytes = 0  # of the texts stored, counted when the file is opened, then kept

    def add(self, q: str, s: str, source: str, target: str) -> None:
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in (q, s, source, target))
        with self._lock:
            if self._db is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
                self._db.execute(SCHEMA)
                self._bytes = self._db.execute("SELECT COALESCE(SUM(length(CAST(q AS BLOB)) + length(CAST(s AS BLOB)) "
                                               "+ length(CAST(source AS BLOB)) + length(CAST(target AS BLOB))), 0) "
                                               "FROM suggestions").fetchone()[0]
            if self.max_bytes and self._bytes + size > self.max_bytes:
                raise SuggestionsFull(f"the server's file of suggestions holds its most bytes ({self.max_bytes:,}, "
                                      "NMT_SUGGESTIONS_MAX_BYTES) until its operator reads and clears it")
            self._db.execute("INSERT INTO suggestions VALUES (?, ?, ?, ?, ?)", (q, s, source, target, time.time()))
            self._db.commit()
            self._bytes += size

    def all(self) -> list[tuple[str, str, str, str]]:
        if not self.path.exists():
            return []
        with sqlite3.connect(self.path) as db:
            return db.execute("SELECT q, s, source, target FROM suggestions ORDER BY created").fetchall()
