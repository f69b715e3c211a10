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


class SuggestionStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def add(self, q: str, s: str, source: str, target: str) -> None:
        with self._lock:
            if self._db is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
                self._db.execute(SCHEMA)
            self._db.execute("INSERT INTO suggestions VALUES (?, ?, ?, ?, ?)", (q, s, source, target, time.time()))
            self._db.commit()

    def all(self) -> list[tuple[str, str, str, str]]:
        if not self.path.exists():
            return []
        with sqlite3.connect(self.path) as db:
            return db.execute("SELECT q, s, source, target FROM suggestions ORDER BY created").fetchall()
