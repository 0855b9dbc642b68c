"""The three moments at which a service ends a transaction itself (see the package docstring).

Everywhere else the owner of the unit of work commits: the route, the reaper, the
command. Each helper names why the owner cannot wait; `tests/app/test_unit_of_work.py`
fails on a bare `commit()` outside the owners.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session


def commit_before_raising(db: Session) -> None:
    """Keep what must outlive the error raised next (an audited denial, a failed login, a job
    failed because its input's grant ended): the owner never commits a unit that raises."""
    db.commit()


def commit_before_waiting(db: Session) -> None:
    """End the transaction before a slow wait (a body streaming in, a password hash, a stream's
    next batch), so that no lock is held through it; what was read stays loaded."""
    db.commit()


def commit_with_file(db: Session, placed: Path) -> None:
    """Commit a row together with the file just moved in place for it: if the commit fails,
    the file goes, so neither stands without the other."""
    try:
        db.commit()
    except BaseException:
        placed.unlink(missing_ok=True)
        raise
