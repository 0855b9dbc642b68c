"""The background thread that appends the counted rows of refusal windows as they end."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from app.audit import refusals
from app.audit.service import flush_refusals
from app.db import session_scope

log = logging.getLogger("nebula.audit")


class RefusalFlusher:
    """Appends ended refusal windows every interval, and every window's counts at stop."""

    def __init__(self, factory: sessionmaker[Session], *, interval_s: float = 1.0) -> None:
        self.factory = factory
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nebula-refusals", daemon=True)

    def flush_once(self, *, everything: bool = False) -> int:
        """One pass (its own unit of work); the rows appended."""
        engine = self.factory.kw["bind"]
        if not refusals.windows_of(engine).pending(everything=everything):
            return 0  # no session, no lock: the usual case
        for db in session_scope(self.factory):
            appended = flush_refusals(db, everything=everything)
            db.commit()
            return appended
        return 0

    def start(self) -> RefusalFlusher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            self.flush_once(everything=True)  # counts still in memory are kept
        except Exception:
            log.exception("final flush of counted refusals failed")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush_once()
            except Exception:
                log.exception("flushing counted refusals failed")
