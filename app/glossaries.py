"""Glossaries: stored ones in DeepL's shape (POST/GET/DELETE /v2/glossaries) and the terminology
of one request (`glossary`, `glossary_id`, `do_not_translate` in /translate, /translate_file and
/v1/translate), both turned into a `model.terms.Terminology`.

A stored glossary belongs to the API key that created it (its SHA-256; "" for clients without a
key) and is seen by no other key. It lives where the API keys live: the SQLite file NMT_KEYS_DB,
or with NMT_REDIS_URL a Redis hash of its key's own (`nmt:glossaries:<SHA-256 or "anyone">`), so
every replica sees it and listing one key's reads no other key's.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
import threading
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from model.terms import TermError, Terminology, check_term

MAX_ENTRIES = 5000  # entries of one glossary (stored or in a request)

SCHEMA = """CREATE TABLE IF NOT EXISTS glossaries (
    glossary_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    record TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS glossaries_by_owner ON glossaries (owner, created)"""


@dataclass
class Glossary:
    glossary_id: str
    name: str
    source_lang: str  # lower-case codes, as our models name languages
    target_lang: str
    entries: dict[str, str]
    creation_time: str  # ISO 8601, UTC
    owner: str

    def info(self) -> dict:
        """DeepL's GlossaryInfo."""
        return {"glossary_id": self.glossary_id, "name": self.name, "ready": True,
                "source_lang": self.source_lang, "target_lang": self.target_lang,
                "creation_time": self.creation_time, "entry_count": len(self.entries)}

    def tsv(self) -> str:
        return "".join(f"{s}\t{t}\n" for s, t in self.entries.items())


def owner_of(key: str | None) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() if key else ""


def new_glossary(name: str, source_lang: str, target_lang: str, entries: dict[str, str], owner: str) -> Glossary:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Glossary(str(uuid.uuid4()), name, source_lang, target_lang, entries, now, owner)


def ours(glossary_id: str) -> bool:
    """Whether an id is of the form new_glossary gives (a UUID as str() writes it): any other names no
    glossary and is not looked up (a client's id may be anything, a lone surrogate too, which
    neither SQLite nor Redis can encode)."""
    try:
        return str(uuid.UUID(glossary_id)) == glossary_id
    except (ValueError, TypeError, AttributeError):
        return False


def one_stored(glossary_id: str | None) -> tuple[str, ...]:
    """The stored glossaries a request names with one glossary_id (DeepL's glossary_ids: several)."""
    return (glossary_id,) if glossary_id else ()


def parse_entries(text: str, entries_format: str = "tsv") -> dict[str, str]:
    """DeepL's entry formats: `tsv` (source TAB target per line) or `csv` (source,target[,...]).
    TermError for an empty, duplicate or malformed entry, or too many."""
    if entries_format not in ("tsv", "csv"):
        raise TermError(f"entries_format {entries_format!r}: 'tsv' or 'csv'")
    if entries_format == "tsv":
        rows = [line.split("\t") for line in text.splitlines() if line.strip()]
        bad = next((r for r in rows if len(r) != 2), None)
        if bad is not None:
            raise TermError(f"entry {bad[0][:40]!r}: a line holds a source term, a tab and a target term")
    else:
        rows = [r[:2] for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
        bad = next((r for r in rows if len(r) < 2), None)
        if bad is not None:
            raise TermError(f"entry {bad[0][:40]!r}: a row holds a source term and a target term")
    return entries_dict(rows)


def entries_dict(pairs) -> dict[str, str]:
    """Entries checked one by one (model.terms.check_term), no source term twice, at most MAX_ENTRIES."""
    out: dict[str, str] = {}
    for source, target in pairs:
        check_term(source, "source term")
        check_term(target, f"target term of {source!r}")
        if source in out:
            raise TermError(f"source term {source!r} appears twice")
        out[source] = target
    if not out:
        raise TermError("the glossary has no entries")
    if len(out) > MAX_ENTRIES:
        raise TermError(f"{len(out):,} entries; at most {MAX_ENTRIES:,} per glossary")
    return out


def inline_terminology(glossary, do_not_translate) -> Terminology | None:
    """A request's own `glossary` (an object, or in a form its JSON) and `do_not_translate` (a
    list, or in a form its JSON or a single term). TermError says what is wrong."""
    if isinstance(glossary, str):
        try:
            glossary = json.loads(glossary)
        except ValueError:
            raise TermError("glossary: a JSON object of source term -> target term") from None
    if isinstance(do_not_translate, str):
        try:
            do_not_translate = json.loads(do_not_translate) if do_not_translate.lstrip().startswith("[") \
                else [do_not_translate]
        except ValueError:
            raise TermError("do_not_translate: a JSON list of terms") from None
    if glossary is not None and not (isinstance(glossary, dict) and all(isinstance(v, str) for v in glossary.values())):
        raise TermError("glossary: an object of source term -> target term (strings)")
    if do_not_translate is not None and not (isinstance(do_not_translate, list)
                                             and all(isinstance(t, str) for t in do_not_translate)):
        raise TermError("do_not_translate: a list of terms (strings)")
    if not glossary and not do_not_translate:
        return None
    entries = entries_dict(glossary.items()) if glossary else {}
    keep = list(dict.fromkeys(do_not_translate or []))
    if len(keep) > MAX_ENTRIES:
        raise TermError(f"do_not_translate: {len(keep):,} terms; at most {MAX_ENTRIES:,}")
    return Terminology(entries, keep)


def kept_by_second_leg(terms: Terminology | None) -> list[str] | None:
    """Through a pivot (A -> B -> C) the first leg writes the glossary's target terms and keeps the
    do-not-translate terms; the second leg keeps both as written."""
    if not terms:
        return None
    return list(dict.fromkeys(terms.keep + list(terms.glossary.values()))) or None


# --- the stores ----------------------------------------------------------------------------------

def stored_bytes(g: Glossary) -> int:
    """What a glossary takes in its store."""
    return len(_record(g).encode("utf-8", "surrogatepass"))


def _record(g: Glossary) -> str:
    return json.dumps(asdict(g), ensure_ascii=False)


class GlossaryStore:
    """Glossaries in the SQLite file of the API keys."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            self._db.executescript(SCHEMA)
            self._db.commit()
        return self._db

    def put(self, glossary: Glossary) -> None:
        with self._lock:
            db = self._connect()
            db.execute("INSERT INTO glossaries VALUES (?, ?, ?, julianday('now'))",
                       (glossary.glossary_id, glossary.owner, _record(glossary)))
            db.commit()

    def get(self, glossary_id: str, owner: str) -> Glossary | None:
        if not ours(glossary_id):
            return None
        with self._lock:
            row = self._connect().execute("SELECT record FROM glossaries WHERE glossary_id = ? AND owner = ?",
                                          (glossary_id, owner)).fetchone()
        return Glossary(**json.loads(row[0])) if row else None

    def list(self, owner: str) -> list[Glossary]:
        with self._lock:
            rows = self._connect().execute("SELECT record FROM glossaries WHERE owner = ? ORDER BY created",
                                           (owner,)).fetchall()
        return [Glossary(**json.loads(r[0])) for r in rows]

    def delete(self, glossary_id: str, owner: str) -> bool:
        if not ours(glossary_id):
            return False
        with self._lock:
            db = self._connect()
            removed = db.execute("DELETE FROM glossaries WHERE glossary_id = ? AND owner = ?",
                                 (glossary_id, owner)).rowcount
            db.commit()
        return removed > 0

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class RedisGlossaryStore:
    """The same glossaries in Redis, no TTL: a hash per owner (field: the id), so that listing a
    key's glossaries reads that key's alone (at most NMT_MAX_GLOSSARY_BYTES_PER_KEY), never every
    key's. Glossaries stored in the one hash `nmt:glossaries` before are moved to their owners'
    hashes by the first call that reaches Redis."""

    LEGACY_HASH = "nmt:glossaries"

    def __init__(self, url: str):
        from app.keys import RedisKeyStore

        self.keys = RedisKeyStore(url)  # its client and its error handling
        self._legacy_moved = False

    @staticmethod
    def _name(owner: str) -> str:
        """The owner's hash (owner: a SHA-256 in hex, or "" where no keys are in force)."""
        return f"nmt:glossaries:{owner or 'anyone'}"

    def _hash(self, owner: str) -> str:
        if not self._legacy_moved:
            self._move_legacy()
        return self._name(owner)

    def _move_legacy(self) -> None:
        client, call = self.keys.client, self.keys._call
        cursor = None
        while cursor != 0:
            cursor, found = call(client.hscan, self.LEGACY_HASH, cursor or 0, None, 100)
            for glossary_id, record in found.items():
                call(client.hset, self._name(json.loads(record)["owner"]), glossary_id, record)
                call(client.hdel, self.LEGACY_HASH, glossary_id)
        self._legacy_moved = True

    def put(self, glossary: Glossary) -> None:
        self.keys._call(self.keys.client.hset, self._hash(glossary.owner), glossary.glossary_id, _record(glossary))

    def get(self, glossary_id: str, owner: str) -> Glossary | None:
        if not ours(glossary_id):
            return None
        found = self.keys._call(self.keys.client.hget, self._hash(owner), glossary_id)
        return Glossary(**json.loads(found)) if found else None

    def list(self, owner: str) -> list[Glossary]:
        stored = self.keys._call(self.keys.client.hvals, self._hash(owner))
        return sorted((Glossary(**json.loads(v)) for v in stored), key=lambda g: g.creation_time)

    def delete(self, glossary_id: str, owner: str) -> bool:
        if not ours(glossary_id):
            return False
        return self.keys._call(self.keys.client.hdel, self._hash(owner), glossary_id) > 0

    def close(self) -> None:
        self.keys.close()


def open_glossaries(keys_db: str, redis_url: str = "") -> GlossaryStore | RedisGlossaryStore:
    return RedisGlossaryStore(redis_url) if redis_url else GlossaryStore(keys_db)
