"""Refusals (denied lookups, locked-out logins) recorded without letting anyone flood the log.

Each refusal used to append its own row and take the chain's lock: one user, or one
address with no login, could grow the append-only table without end. Here:

- the first refusal of its kind (who, from where, what, on which id, with which answer)
  in a window is recorded at once; identical ones within the window only count, and one
  row with the count (`details.repeats`) is appended when the window ends;
- each user and each address may have `per_window` refusals of distinct kinds recorded
  per window; past that a refusal answers 429 and only counts, in one row per window
  (`outcome` "throttled", `details.count`).

Counted rows are ordinary events of the chain. The counts live in this process's memory
until their window ends (the server flushes each second and at shutdown): a process that
is killed loses at most one window's counts, never a first refusal.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy.engine import Engine

# who, from where, what, on which id, answered how
RefusalKind = tuple[str | None, str | None, str, str | None, str | None, str, int]


class Verdict(Enum):
    """What to do with one refusal."""

    record = "record"  # append its row now
    repeat = "repeat"  # counted into the row of its window
    throttle = "throttle"  # its source is over its budget: counted, answered 429


@dataclass
class _Window:
    opened: float
    count: int = 0


@dataclass(frozen=True)
class CountedRow:
    """A row to append for a window that ended with counts in it."""

    actor_id: str | None
    ip: str | None
    action: str
    subject_type: str | None
    subject_id: str | None
    outcome: str
    details: dict[str, Any]


@dataclass
class RefusalWindows:
    """One database's refusal windows in this process (thread-safe)."""

    window_s: float = 60.0
    per_window: int = 30
    clock: Any = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _repeats: dict[RefusalKind, _Window] = field(default_factory=dict)
    _budgets: dict[tuple[str, str], _Window] = field(default_factory=dict)
    # (user id, address, action) -> refusals answered 429 in the window
    _throttled: dict[tuple[str | None, str | None, str], _Window] = field(default_factory=dict)
    _closed: list[CountedRow] = field(default_factory=list)

    def judge(self, kind: RefusalKind) -> Verdict:
        """Record, count as a repeat, or throttle this refusal."""
        now = self.clock()
        with self._lock:
            window = self._repeats.get(kind)
            if window is not None and now - window.opened < self.window_s:
                window.count += 1
                return Verdict.repeat
            if window is not None:
                self._close_repeats(kind, self._repeats.pop(kind))
            actor_id, ip, action = kind[0], kind[1], kind[2]
            sources = [("user", actor_id)] if actor_id else []
            sources += [("address", ip)] if ip else []
            budgets = []
            for source in sources:
                budget = self._budgets.get(source)
                if budget is None or now - budget.opened >= self.window_s:
                    budget = self._budgets[source] = _Window(now)
                budgets.append(budget)
            if any(budget.count >= self.per_window for budget in budgets):
                key = (actor_id, ip, action)
                throttled = self._throttled.get(key)
                if throttled is not None and now - throttled.opened >= self.window_s:
                    self._close_throttled(key, self._throttled.pop(key))
                    throttled = None
                if throttled is None:
                    throttled = self._throttled[key] = _Window(now)
                throttled.count += 1
                return Verdict.throttle
            for budget in budgets:
                budget.count += 1
            self._repeats[kind] = _Window(now)
            return Verdict.record

    def _close_repeats(self, kind: RefusalKind, window: _Window) -> None:
        if window.count:
            actor_id, ip, action, subject_type, subject_id, outcome, status = kind
            details = {"status": status, "repeats": window.count, "window_s": self.window_s}
            self._closed.append(
                CountedRow(actor_id, ip, action, subject_type, subject_id, outcome, details)
            )

    def _close_throttled(self, key: tuple[str | None, str | None, str], window: _Window) -> None:
        actor_id, ip, action = key
        details = {"status": 429, "count": window.count, "window_s": self.window_s}
        self._closed.append(CountedRow(actor_id, ip, action, None, None, "throttled", details))

    def due(self, *, everything: bool = False) -> list[CountedRow]:
        """Take the rows of windows that have ended (of all windows, at shutdown)."""
        now = self.clock()
        with self._lock:
            for kind, window in list(self._repeats.items()):
                if everything or now - window.opened >= self.window_s:
                    self._close_repeats(kind, self._repeats.pop(kind))
            for key, throttled in list(self._throttled.items()):
                if everything or now - throttled.opened >= self.window_s:
                    self._close_throttled(key, self._throttled.pop(key))
            for source, budget in list(self._budgets.items()):
                if now - budget.opened >= self.window_s:
                    del self._budgets[source]
            rows, self._closed = self._closed, []
        return rows

    def give_back(self, rows: list[CountedRow]) -> None:
        """Rows taken by `due` that could not be appended: appended with the next ones."""
        with self._lock:
            self._closed = rows + self._closed

    def pending(self, *, everything: bool = False) -> bool:
        """Whether a window has ended with counts (any window holds counts, at shutdown)."""
        now = self.clock()
        with self._lock:
            if self._closed or (self._throttled and everything):
                return True
            windows = [*self._repeats.values(), *self._throttled.values()]
            return any(w.count and (everything or now - w.opened >= self.window_s) for w in windows)


_windows: WeakKeyDictionary[Engine, RefusalWindows] = WeakKeyDictionary()
_windows_lock = threading.Lock()


def bind(engine: Engine, *, window_s: float, per_window: int) -> None:
    """Set the window and the budget of refusals recorded on `engine`'s database."""
    with _windows_lock:
        _windows[engine] = RefusalWindows(window_s=window_s, per_window=per_window)


def windows_of(engine: Engine) -> RefusalWindows:
    """The refusal windows of `engine`'s database (the defaults when none were bound)."""
    with _windows_lock:
        windows = _windows.get(engine)
        if windows is None:
            windows = _windows[engine] = RefusalWindows()
        return windows
