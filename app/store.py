"""Chats and settings on disk: one SQLite file, ``specchat.db``, in the data directory.

    store = ChatStore.open(data_dir() / DB_NAME)
    chat = store.new_chat(model="SmolLM2-135M", strategy=session.strategy.to_dict())
    store.add_message(chat, "user", "hello")           # committed before it returns
    store.add_message(chat, "assistant", "hi", stats={"tokens": 2, "finish_reason": "eos"})

The data directory is ``$SPECCHAT_DATA_DIR``, else ``$XDG_DATA_HOME/specchat``, else
``~/.local/share/specchat``; it is created 0700 and the database 0600. The database runs in WAL
mode with every write in its own transaction, so a crash (even ``kill -9``) loses at most the
reply being generated. ``meta.schema_version`` says which schema the file holds; older files are
upgraded by :data:`MIGRATIONS` on open and newer ones are refused with a one-line error.

Not thread-safe: the app uses one store from its UI thread only.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engine.errors import SpecchatError
from engine.strategy import Strategy, StrategyError

from .text_safety import strip_controls

DB_NAME = "specchat.db"
DATA_DIR_ENV = "SPECCHAT_DATA_DIR"
SCHEMA_VERSION = 1
TITLE_MAX = 60  # characters of the first user message kept as the chat's title
HISTORY_MAX = 1000  # prompts recalled with Up/Down


class StoreError(SpecchatError):
    """The chat database cannot be opened or written; the message is one line naming the file."""


class StoreDamaged(StoreError):
    """The file is damaged: SQLite finds it malformed, or not a database at all. :func:`open_store`
    keeps it aside, untouched, and starts a fresh one."""


class ChatChanged(StoreError):
    """The chat's saved messages are not the ones the writer expects (another specchat window wrote
    to it): nothing was written."""


def data_dir() -> Path:
    """Where specchat keeps its data (see the module docstring); not created here."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".local" / "share"
    return base / "specchat"


def now() -> str:
    """A UTC timestamp, ISO 8601 with microseconds (sorts as text, so chats order by it)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def title_from(text: str) -> str:
    """A chat title from its first user message: one line, at most :data:`TITLE_MAX` characters,
    nothing a terminal would act on (a pasted "\x1b[31m" reached the header and the chat list)."""
    line = " ".join(strip_controls(text).split())
    return line if len(line) <= TITLE_MAX else line[: TITLE_MAX - 1].rstrip() + "…"


# ---- schema -------------------------------------------------------------------------------------
SCHEMA_V1 = (
    """CREATE TABLE chats (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        title    TEXT NOT NULL DEFAULT '',
        created  TEXT NOT NULL,
        updated  TEXT NOT NULL,
        model    TEXT NOT NULL DEFAULT '',
        strategy TEXT                        -- JSON: engine.strategy.Strategy.to_dict()
    )""",
    """CREATE TABLE messages (
        chat_id  INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        idx      INTEGER NOT NULL,           -- position in the conversation, from 0
        role     TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
        content  TEXT NOT NULL,
        created  TEXT NOT NULL,
        stats    TEXT,                       -- JSON: tokens, tok_s, mean_accepted, finish_reason, ...
        PRIMARY KEY (chat_id, idx)
    )""",
    "CREATE INDEX chats_by_updated ON chats(updated)",
    "CREATE INDEX user_messages_by_time ON messages(created) WHERE role = 'user'",
    """CREATE TABLE settings (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL                  -- JSON
    )""",
)


SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26  # the primary result codes of a damaged file
DAMAGED_MESSAGES = ("database disk image is malformed", "file is not a database")  # (Python 3.10: no error codes)


def is_damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite's error says the file itself is damaged (not locked, unreadable or full)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)
    return str(exc) in DAMAGED_MESSAGES


def check_intact(path: Path) -> None:
    """StoreDamaged if SQLite finds the file damaged: its quick check, on a connection of its own,
    read-only, before the app's writes to it. A file damaged inside (a bad disk, a copy cut short)
    opened as if sound, its chats could not be read, and new chats were written into it, over pages
    a recovery could still have read; and closing a read-write connection to a damaged file
    checkpointed its WAL into it and deleted the WAL (a read-only one leaves both). Where the check
    cannot run (a locked or unreadable file) it says nothing: the read-write open says why. (Reads
    every page once: ~40 ms for a 120 MB file, page cache warm.)"""
    try:
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return
    try:
        row = db.execute("PRAGMA quick_check(1)").fetchone()
    except sqlite3.Error as exc:
        if is_damage(exc):
            raise StoreDamaged(f"not a usable chat database: {exc}", path=str(path)) from None
        return
    finally:
        db.close()
    if row is None or row[0] != "ok":
        found = " ".join(str(row[0] if row else "no answer").replace("*** in database main ***", "").split())
        raise StoreDamaged(f"the chat database is damaged (SQLite's check: {found[:160]})", path=str(path))


def _create_v1(db: sqlite3.Connection) -> None:
    # one statement at a time: executescript() would commit the migration's transaction early
    for statement in SCHEMA_V1:
        db.execute(statement)


# MIGRATIONS[v] upgrades a version-v file to version v + 1 (0: an empty file). Each runs inside
# the transaction that also bumps meta.schema_version, so an upgrade is all or nothing.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {0: _create_v1}


def schema_version(db: sqlite3.Connection) -> int:
    """The file's schema version (0 for an empty file)."""
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    if not has_meta:
        if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone():
            raise sqlite3.DatabaseError("it has tables but no meta table (not a specchat database)")
        return 0
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise sqlite3.DatabaseError("its meta table has no schema_version")
    try:  # a damaged value is a damaged file (int() raised past open_store: a traceback at start-up)
        return int(row[0])
    except (TypeError, ValueError):
        raise sqlite3.DatabaseError(f"its schema_version is {row[0]!r}, not a number") from None


def migrate(db: sqlite3.Connection, path: object, target: int | None = None) -> int:
    """Bring the file up to ``target`` (default :data:`SCHEMA_VERSION`); return the version it had."""
    target = SCHEMA_VERSION if target is None else target
    db.execute("BEGIN IMMEDIATE")  # one writer at a time: two apps opening a new file don't race
    try:
        found = schema_version(db)
        if found > target:
            raise StoreError(
                f"chat database schema version {found} is newer than this specchat supports ({target}): "
                f"upgrade specchat, or set {DATA_DIR_ENV} to another directory", path=str(path))
        for version in range(found, target):
            step = MIGRATIONS.get(version)
            if step is None:
                raise StoreError(f"no migration from chat database schema version {version}", path=str(path))
            step(db)
        if found < target:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(target),))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return found


# ---- records ------------------------------------------------------------------------------------
@dataclass
class ChatRecord:
    """A row of ``chats`` (``messages``: how many user and assistant messages it holds, for the chat list)."""

    id: int
    title: str
    created: str
    updated: str
    model: str
    strategy: dict[str, Any] | None
    messages: int = 0


@dataclass
class MessageRecord:
    """A row of ``messages``; ``stats`` is None for user messages."""

    chat_id: int
    idx: int
    role: str
    content: str
    created: str
    stats: dict[str, Any] | None

    @property
    def finish_reason(self) -> str | None:
        reason = (self.stats or {}).get("finish_reason")
        return reason if isinstance(reason, str) else None  # (a damaged value: no mark)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _unjson(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None  # a hand-edited or damaged value reads as missing


def _unjson_table(text: str | None) -> dict[str, Any] | None:
    """A JSON object column (a message's stats, a chat's strategy); anything else reads as missing
    (a damaged ``[1, 2]`` or ``"eos"`` was read as the stats and crashed the chat's display)."""
    value = _unjson(text)
    return value if isinstance(value, dict) else None


def _text(value: Any) -> str:
    """A TEXT column as text: SQLite keeps whatever type a damaged or hand-edited file holds (an
    integer, a blob), which the chat, its title and the prompt history cannot show."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _fold(value: Any) -> str:
    """A TEXT column casefolded, for a search in any case (:meth:`ChatStore.chats`)."""
    return _text(value).casefold()


class ChatStore:
    """The open database. Every public method commits before it returns."""

    def __init__(self, db: sqlite3.Connection, path: Path | None) -> None:
        self._db = db
        db.create_function("specchat_fold", 1, _fold, deterministic=True)  # the search's case folding
        self.path = path  # None: in memory (nothing is saved)

    # ---- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | str | None) -> "ChatStore":
        """Open (creating or upgrading) the database at ``path``; None: a throwaway in-memory one."""
        if path is None:
            db = sqlite3.connect(":memory:", isolation_level=None)
            migrate(db, ":memory:")
            db.execute("PRAGMA foreign_keys = ON")
            return cls(db, None)
        path = Path(path)
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True, mode=0o700)
                path.parent.chmod(0o700)  # mkdir's mode is masked by the umask
            if not path.exists():
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
                path.chmod(0o600)
            check_intact(path)  # (before anything is written to it)
            db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
        except OSError as exc:
            raise StoreError(f"cannot create the chat database: {exc.strerror or exc}", path=str(path)) from None
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the chat database: {exc}", path=str(path)) from None
        try:
            db.execute("PRAGMA foreign_keys = ON")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot use WAL mode (journal mode stays {mode})")
            db.execute("PRAGMA synchronous = FULL")  # a committed message survives a power cut too
            migrate(db, path)
        except sqlite3.Error as exc:
            db.close()
            if is_damage(exc):
                raise StoreDamaged(f"not a usable chat database: {exc}", path=str(path)) from None
            raise StoreError(_why_unusable(exc, path), path=str(path)) from None
        except BaseException:
            db.close()
            raise
        return cls(db, path)

    def close(self) -> None:
        """Close the file (idempotent); later calls raise StoreError."""
        self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction, committed on exit; sqlite errors become one-line StoreErrors."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"could not save: {exc}", path=str(self.path or ":memory:")) from None

    def _check_exists(self, db: sqlite3.Connection, chat_id: int) -> None:
        """StoreError unless the chat is in the file (another specchat window may have deleted it:
        the write then failed with "FOREIGN KEY constraint failed", or wrote nothing and said nothing)."""
        if db.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone() is None:
            raise StoreError("could not save: this chat was deleted (in another specchat window?); "
                             "start a new chat (Ctrl+N) to keep what follows", path=str(self.path or ":memory:"))

    def _check_count(self, db: sqlite3.Connection, chat_id: int, expect: int | None) -> None:
        """ChatChanged unless the chat has ``expect`` messages (None: no check): the writer's view of
        it is stale, another specchat window wrote to it."""
        if expect is None:
            return
        n = int(db.execute("SELECT COUNT(*) FROM messages WHERE chat_id = ?", (chat_id,)).fetchone()[0])
        if n != expect:
            raise ChatChanged(f"the chat has {n} saved messages, not {expect}: another window wrote to it",
                              path=str(self.path or ":memory:"))

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"could not read: {exc}", path=str(self.path or ":memory:")) from None

    # ---- chats ----------------------------------------------------------------------------------
    def new_chat(self, title: str = "", model: str = "", strategy: dict[str, Any] | None = None) -> int:
        """A new, empty chat; returns its id."""
        stamp = now()
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO chats (title, created, updated, model, strategy) VALUES (?, ?, ?, ?, ?)",
                (title, stamp, stamp, model, _json(strategy)))
            return int(cur.lastrowid or 0)

    def chats(self, search: str = "") -> list[ChatRecord]:
        """Every chat, the most recently updated first; with ``search``, those whose title or any
        user or assistant message contains it, in any case: SQLite's LIKE for an ASCII search (it
        folds ASCII letters only, and scans ~10x faster than a Python function), Unicode case
        folding for any other (LIKE's "ÉTÉ" did not find "été")."""
        where: str = ""
        args: tuple[Any, ...] = ()
        if search and search.isascii():
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where = (" WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
                     " WHERE m.chat_id = c.id AND m.role != 'system' AND m.content LIKE ? ESCAPE '\\')")
            args = (pattern, pattern)
        elif search:
            where = (" WHERE instr(specchat_fold(c.title), ?) OR EXISTS (SELECT 1 FROM messages m"
                     " WHERE m.chat_id = c.id AND m.role != 'system' AND instr(specchat_fold(m.content), ?))")
            args = (search.casefold(),) * 2
        rows = self._read(
            "SELECT c.id, c.title, c.created, c.updated, c.model, c.strategy,"
            " (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id AND m.role != 'system')"
            " FROM chats c" + where + " ORDER BY c.updated DESC, c.id DESC", args)
        return [ChatRecord(r[0], _text(r[1]), _text(r[2]), _text(r[3]), _text(r[4]), _unjson_table(r[5]), r[6])
                for r in rows]

    def chat(self, chat_id: int) -> ChatRecord | None:
        return next((c for c in self.chats() if c.id == chat_id), None)

    def rename_chat(self, chat_id: int, title: str) -> None:
        with self._write() as db:
            db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        """Delete the chat and its messages."""
        with self._write() as db:
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # ---- messages -------------------------------------------------------------------------------
    def add_message(self, chat_id: int, role: str, content: str, stats: dict[str, Any] | None = None, *,
                    model: str | None = None, strategy: dict[str, Any] | None = None, at: int | None = None) -> int:
        """Append a message (committed on return); returns its index in the chat. With ``at``, only
        as the chat's message ``at`` (else ChatChanged, nothing written: another window wrote to it).

        The chat's ``updated`` moves on; its first user message becomes its title if it has none;
        ``model`` and ``strategy``, when given, record what the chat last ran with.
        """
        stamp = now()
        with self._write() as db:
            self._check_exists(db, chat_id)
            row = db.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE chat_id = ?", (chat_id,)).fetchone()
            idx = int(row[0])
            if at is not None and idx != at:
                raise ChatChanged(f"the chat has {idx} saved messages, not {at}: another window wrote to it",
                                  path=str(self.path or ":memory:"))
            db.execute("INSERT INTO messages (chat_id, idx, role, content, created, stats) VALUES (?, ?, ?, ?, ?, ?)",
                       (chat_id, idx, role, content, stamp, _json(stats)))
            db.execute("UPDATE chats SET updated = ? WHERE id = ?", (stamp, chat_id))
            if role == "user":
                db.execute("UPDATE chats SET title = ? WHERE id = ? AND title = ''", (title_from(content), chat_id))
            if model is not None:
                db.execute("UPDATE chats SET model = ? WHERE id = ?", (model, chat_id))
            if strategy is not None:
                db.execute("UPDATE chats SET strategy = ? WHERE id = ?", (_json(strategy), chat_id))
        return idx

    def set_system(self, chat_id: int, text: str, *, expect: int | None = None, was: str | None = None) -> None:
        """The chat's system prompt, its message 0 with the role "system": set (the other messages
        move one on, in order), replaced, or removed with ``text`` "" (they move back).

        With ``expect`` (how many messages the writer knows the chat has) and ``was`` (the system
        prompt it knows, "" for none), only where the chat still is so (else ChatChanged, nothing
        written): a window's change made from what it read earlier replaced or removed the prompt
        another specchat window had set since, and moved messages it had never seen."""
        with self._write() as db:
            self._check_exists(db, chat_id)
            self._check_count(db, chat_id, expect)
            first = db.execute("SELECT role, content FROM messages WHERE chat_id = ? AND idx = 0", (chat_id,)).fetchone()
            has = first is not None and first[0] == "system"
            if was is not None and (_text(first[1]) if has else "") != was:
                raise ChatChanged("the chat's system prompt is not the one this window has: another window changed it",
                                  path=str(self.path or ":memory:"))
            # two passes through negative indices: (chat_id, idx) stays unique row by row
            if text and has:
                db.execute("UPDATE messages SET content = ? WHERE chat_id = ? AND idx = 0", (text, chat_id))
            elif text:
                db.execute("UPDATE messages SET idx = -idx - 1 WHERE chat_id = ?", (chat_id,))
                db.execute("UPDATE messages SET idx = -idx WHERE chat_id = ? AND idx < 0", (chat_id,))
                db.execute("INSERT INTO messages (chat_id, idx, role, content, created, stats) VALUES (?, 0, 'system', ?, ?, NULL)",
                           (chat_id, text, now()))
            elif has:
                db.execute("DELETE FROM messages WHERE chat_id = ? AND idx = 0", (chat_id,))
                db.execute("UPDATE messages SET idx = -idx WHERE chat_id = ? AND idx > 0", (chat_id,))
                db.execute("UPDATE messages SET idx = -idx - 1 WHERE chat_id = ? AND idx < 0", (chat_id,))

    def replace_last(self, chat_id: int, role: str, content: str, stats: dict[str, Any] | None = None, *,
                     expect: int | None = None, was: str | None = None) -> None:
        """The chat's last message, if it has ``role``, takes ``content`` and ``stats`` (a continued
        reply), in one write; StoreError if the last message has another role.

        With ``expect`` (how many messages the writer knows the chat has) and ``was`` (the text it
        knows the last message, of ``role``, has), only where the chat still is so (else
        ChatChanged, nothing written): a continuation overwrote whatever another specchat window
        had saved last meanwhile (its own reply, or its own continuation of the same one)."""
        with self._write() as db:
            self._check_exists(db, chat_id)
            self._check_count(db, chat_id, expect)
            row = db.execute("SELECT idx, role, content FROM messages WHERE chat_id = ? ORDER BY idx DESC LIMIT 1",
                             (chat_id,)).fetchone()
            if was is not None and (row is None or row[1] != role or _text(row[2]) != was):
                raise ChatChanged("the chat's last message is not the one this window has: another window wrote to it",
                                  path=str(self.path or ":memory:"))
            if row is None or row[1] != role:
                found = "none" if row is None else repr(row[1])
                raise StoreError(f"the chat's last message is {found}, not {role!r}", path=str(self.path or ":memory:"))
            db.execute("UPDATE messages SET content = ?, stats = ? WHERE chat_id = ? AND idx = ?",
                       (content, _json(stats), chat_id, row[0]))
            db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now(), chat_id))

    def messages(self, chat_id: int) -> list[MessageRecord]:
        """The chat's messages in order."""
        rows = self._read("SELECT chat_id, idx, role, content, created, stats FROM messages"
                          " WHERE chat_id = ? ORDER BY idx", (chat_id,))
        return [MessageRecord(r[0], r[1], _text(r[2]), _text(r[3]), _text(r[4]), _unjson_table(r[5])) for r in rows]

    def truncate(self, chat_id: int, keep: int, expect: int | None = None) -> int:
        """Delete the chat's messages from index ``keep`` on (regenerate, a failed send); returns how
        many. With ``expect``, only where the chat has that many (else ChatChanged, nothing deleted)."""
        with self._write() as db:
            self._check_count(db, chat_id, expect)
            return db.execute("DELETE FROM messages WHERE chat_id = ? AND idx >= ?", (chat_id, keep)).rowcount

    def prompt_history(self, limit: int = HISTORY_MAX) -> list[str]:
        """The user's last ``limit`` prompts over all chats, oldest first, repeats in a row merged."""
        rows = self._read(
            "SELECT content FROM (SELECT content, created, rowid AS r FROM messages WHERE role = 'user'"
            " ORDER BY created DESC, r DESC LIMIT ?) ORDER BY created, r", (limit,))
        history: list[str] = []
        for (value,) in rows:
            text = _text(value)
            if not history or history[-1] != text:
                history.append(text)
        return history

    # ---- settings -------------------------------------------------------------------------------
    def get_setting(self, key: str, default: Any = None) -> Any:
        rows = self._read("SELECT value FROM settings WHERE key = ?", (key,))
        if not rows:
            return default
        value = _unjson(rows[0][0])
        return default if value is None else value

    def set_setting(self, key: str, value: Any) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, _json(value)))


def _why_unusable(exc: sqlite3.Error, path: Path) -> str:
    """A sound file that cannot be used, in words that do not sound like damage: a read-only data
    directory or file, or a write the disk refused, read "not a usable chat database: unable to open
    database file" / "disk I/O error"."""
    text = str(exc)
    if not os.access(path.parent, os.W_OK) or not os.access(path, os.W_OK):
        return f"the chat database cannot be written here (read-only file or folder: {text})"
    if text in ("disk I/O error", "database or disk is full") or "disk" in text.lower():
        return f"the chat database cannot be written (the disk may be full or failing: {text})"
    return f"not a usable chat database: {text}"


def keep_aside(path: Path) -> Path:
    """Rename the damaged database (with its WAL and shared-memory files, which may hold its last
    commits) to ``specchat.db.damaged-<UTC time>`` beside it, untouched; the new name. OSError if
    it cannot be renamed."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while aside.exists() or Path(f"{aside}-wal").exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    path.rename(aside)
    for suffix in ("-wal", "-shm"):  # with it: a WAL left behind would be read into the fresh file
        side = Path(f"{path}{suffix}")
        if side.exists():
            side.rename(f"{aside}{suffix}")
    return aside


def open_store(path: Path | None = None) -> tuple[ChatStore, str | None]:
    """The app's store: the file in :func:`data_dir` (or ``path``), or, if that cannot be used, an
    in-memory one and the one-line reason (the app then says chats are not being saved).

    A damaged file (:class:`StoreDamaged`) is never written into, emptied or replaced: it is kept
    aside under a new name (:func:`keep_aside`) and a fresh database started in its place; the
    reason then says where the old file went (the store has a path: chats are saved)."""
    path = path or data_dir() / DB_NAME
    try:
        return ChatStore.open(path), None
    except StoreDamaged as exc:
        try:
            aside = keep_aside(path)
        except OSError as move:
            return ChatStore.open(None), f"{exc} (it could not be moved aside: {move.strerror or move})"
        kept = f"{exc}; kept as {aside}, untouched (sqlite3's .recover may get its chats back)"
        try:
            store = ChatStore.open(path)
        except StoreError as fresh:
            return ChatStore.open(None), f"{kept}; a fresh database could not be started either: {fresh.problem}"
        return store, f"{kept}; chats are saved to a fresh database from now on"
    except StoreError as exc:
        copy = _read_only_copy(path)
        if copy is not None:
            return copy, f"{exc}; its chats are shown from a copy in memory, and nothing new is saved"
        return ChatStore.open(None), str(exc)


def _read_only_copy(path: Path) -> ChatStore | None:
    """The chats of a sound database that cannot be written (a read-only data directory or file, a
    full disk), copied into an in-memory store: the app showed no chats at all there, as if they
    were gone. Read through SQLite's read-only mode (which sees a WAL's latest commits where it can
    read the log's index), else as an immutable file; None if neither can read it."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None
        uri = path.resolve().as_uri()
    except (OSError, ValueError):
        return None
    for query in ("mode=ro", "immutable=1"):
        mem = None
        try:
            src = sqlite3.connect(f"{uri}?{query}", uri=True)
            try:
                src.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # (the open is lazy)
                mem = sqlite3.connect(":memory:", isolation_level=None)
                src.backup(mem)
            finally:
                src.close()
            migrate(mem, ":memory:")  # an older schema is upgraded in the copy only
            mem.execute("PRAGMA foreign_keys = ON")
            return ChatStore(mem, None)
        except (sqlite3.Error, StoreError):
            if mem is not None:
                mem.close()
    return None


# ---- strategies ---------------------------------------------------------------------------------
DERIVED_STRATEGY_KEYS = ("verify_resolved",)  # in Strategy.to_dict() but not Strategy fields


def strategy_from_dict(data: object) -> Strategy:
    """Rebuild a Strategy from :meth:`Strategy.to_dict` output; StrategyError (one line) if it is not one.

    Validates the values (not whether this session can run it: the caller checks the drafter).
    """
    if not isinstance(data, dict):
        raise StrategyError("the saved strategy is not a table of settings")
    known = {f.name for f in fields(Strategy)}
    extra = sorted(set(data) - known - set(DERIVED_STRATEGY_KEYS))
    if extra:
        raise StrategyError(f"the saved strategy has unknown settings: {', '.join(extra)}")
    values = {k: v for k, v in data.items() if k in known}
    try:
        if "tree" in values:
            values["tree"] = tuple(int(n) for n in values["tree"])
        if "arms" in values:
            values["arms"] = tuple(tuple(int(n) for n in arm) for arm in values["arms"])
        strategy = Strategy(**values)
        for f in fields(Strategy):  # JSON keeps types loosely: check the scalars match the defaults
            default, value = f.default, getattr(strategy, f.name)
            if isinstance(default, (int, float, str)) and not isinstance(default, bool):
                wanted = (int, float) if isinstance(default, float) else type(default)
                if not isinstance(value, wanted) or isinstance(value, bool):
                    raise StrategyError(f"the saved strategy's {f.name} is {value!r}, not a {type(default).__name__}")
        return strategy.validate(has_drafter_model=True)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, StrategyError):
            raise
        raise StrategyError(f"the saved strategy is damaged: {exc}") from None
