"""Who commits: the owner of a unit of work, never a service (see app/__init__.py).

The commands (cli/) own their units of work and lie outside app/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import app

APP = Path(app.__file__).parent

# Owners of units of work outside the routes, and why each may commit.
OWNERS = {
    "unit_of_work.py": "the three named moments at which a service ends a transaction",
    "db.py": "begin_writing ends a read-only transaction that changed nothing",
    "deps.py": "the credential lookup's read ends before the endpoint's transaction",
}
OWNER_FUNCTIONS = {
    ("jobs/dispatch.py", "reap_once"): "a reaper pass",
    ("jobs/dispatch.py", "_run"): "the reaper's housekeeping pass",
    ("pki/service.py", "ensure_platform_keys"): "start-up, in sessions of its own",
    ("audit/flushing.py", "flush_once"): "a pass that appends ended refusal windows",
    ("jobs/dispatch.py", "schedule_and_dispatch"): (
        "fair-share placement after the caller's commit; each placed job's dispatch its own unit"
    ),
    ("api_errors.py", "_audit_tampering"): "the tampering event, in a session of its own",
}


def _commits(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every `.commit()` call in a module."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = child.name if function == "" else function
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "commit"
            ):
                found.append((name, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text()), "")
    return found


def test_services_never_commit_outside_the_named_moments() -> None:
    bare = []
    for path in sorted(APP.rglob("*.py")):
        where = path.relative_to(APP).as_posix()
        if path.name == "routes.py" or where in OWNERS:
            continue
        for function, line in _commits(path):
            if (where, function) not in OWNER_FUNCTIONS:
                bare.append(f"app/{where}:{line} in {function or 'the module'}")
    assert bare == [], "commit in the owner or through app.unit_of_work: " + ", ".join(bare)


def test_the_scan_sees_commits() -> None:
    """The check above would catch one: the routes do commit, and so do the named owners."""
    assert _commits(APP / "grants" / "routes.py")
    assert {f for f, _ in _commits(APP / "jobs" / "dispatch.py")} == {
        "reap_once",
        "_run",
        "schedule_and_dispatch",
    }
