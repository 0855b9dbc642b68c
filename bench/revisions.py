"""Other commits' code beside this checkout's, for benchmarks that compare a change with
its parent in the same interleaved run (`--against REV`)."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def checkouts(revs: list[str]) -> Iterator[dict[str, Path]]:
    """A temporary git worktree of each of `revs`, by rev; removed afterwards."""
    paths: dict[str, Path] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for n, rev in enumerate(revs):
                path = Path(tmp) / f"against-{n}"
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
                    check=True,
                    capture_output=True,
                )
                paths[rev] = path
            yield paths
        finally:
            for path in paths.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                    check=False,
                    capture_output=True,
                )


def short_head() -> str:
    """This checkout's commit, abbreviated ("unknown" outside git)."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"
