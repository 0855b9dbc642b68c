"""The background thread that keeps the audit chain's signed head up to date."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from app.audit.service import AnchorsMissing, anchor_head
from app.db import session_scope
from app.settings import Settings

log = logging.getLogger("nebula.audit")


class Anchorer:
    """Signs the chain's head into the anchor file at start and then every interval."""

    def __init__(self, factory: sessionmaker[Session], settings: Settings) -> None:
        self.factory = factory
        self.settings = settings
        self._stop = threading.Event()
        # True while the anchor file is missing: nothing is signed until it is restored
        self.halted = False
        self._thread = threading.Thread(target=self._run, name="nebula-anchorer", daemon=True)

    def anchor_once(self) -> None:
        """One pass: anchor the head if it moved; nothing while the anchor file is missing."""
        for db in session_scope(self.factory):
            try:
                anchor_head(db, settings=self.settings)
            except AnchorsMissing as missing:
                if not self.halted:
                    log.critical("audit anchoring stopped: %s", missing)
                self.halted = True
                return
            if self.halted:
                log.warning("audit anchor file restored; anchoring again")
            self.halted = False

    def start(self) -> Anchorer:
        # the first anchor is written before the app serves anything, so that it exists
        # (and fixes where the keyed chain begins) before any request can append
        self.anchor_once()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            self.anchor_once()  # what was appended in the last interval is anchored too
        except Exception:
            log.exception("final audit anchor failed")

    def _run(self) -> None:
        while not self._stop.wait(self.settings.audit_anchor_interval_s):
            try:
                self.anchor_once()
            except Exception:
                log.exception("audit anchor pass failed")
