"""The import rules of DESIGN.md: checked by import-linter ([tool.importlinter] in pyproject.toml),
which must break on a wrong import; no cycle between modules; an API that loads no cluster code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "cli", "common", "contract", "workers")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _checkout_copy(tmp_path: Path) -> Path:
    """The packages and pyproject.toml, copied: a tree to plant wrong imports in."""
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "static")
        )
    return root


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # the copy comes first on the path, before any installed (editable) copy of the project
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _plant(root: Path, module: str, line: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    source = path.read_text()
    # after the module's `from __future__` line, which must stay first
    head, future, rest = source.partition("from __future__ import annotations\n")
    path.write_text(head + future + line + "\n" + rest if future else line + "\n" + source)


# (where, the wrong import, the id of the rule it breaks in pyproject.toml, the chain reported)
PLANTED = [
    pytest.param(
        "workers.runner",
        "import app.db",
        "cluster-side",
        "workers.runner -> app.db",
        id="a-worker-reads-the-database",
    ),
    pytest.param(
        "app.jobs.dispatch",
        "import workers.tasks",
        "control-plane",
        "app.jobs.dispatch -> workers.tasks",
        id="the-control-plane-loads-a-task",
    ),
    pytest.param(
        "workers.switch.server",
        "import workers.control_plane",
        "switch",
        "workers.switch.server -> workers.control_plane",
        id="the-switch-calls-the-control-plane",
    ),
    pytest.param(
        "common.private_files",
        "import workers.settings",
        "common",
        "common.private_files -> workers.settings",
        id="the-neutral-package-takes-a-side",
    ),
    pytest.param(
        "app.grants.models",
        "import app.grants.service",
        "domain-layers",
        "app.grants.models -> app.grants.service",
        id="a-model-imports-its-service",
    ),
    pytest.param(
        "app.accounts.service",
        "import app.accounts.routes",
        "domain-layers",
        "app.accounts.service -> app.accounts.routes",
        id="a-service-imports-its-routes",
    ),
    pytest.param(
        "app.clusters.service",
        "import fastapi",
        "services-without-http",
        "app.clusters.service -> fastapi",
        id="a-service-speaks-http",
    ),
    pytest.param(
        "app.jobs.schemas",
        "import app.jobs.dispatch",
        "services-without-celery",
        "app.jobs.schemas -> app.jobs.dispatch",
        id="a-service-loads-celery-through-a-schema",
    ),
]


def _rule_name(rule_id: str) -> str:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c["name"] for c in config["contracts"] if c.get("id") == rule_id)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkout_copy(tmp_path_factory.mktemp("imports"))


def test_the_import_rules_hold(tree: Path) -> None:
    kept = _lint_imports(tree)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "0 broken" in kept.stdout


@pytest.mark.parametrize(("module", "line", "rule", "chain"), PLANTED)
def test_a_wrong_import_breaks_its_rule(
    tree: Path, module: str, line: str, rule: str, chain: str
) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    original = path.read_text()
    _plant(tree, module, line)
    try:
        broken = _lint_imports(tree)
    finally:
        path.write_text(original)
    report = " ".join(broken.stdout.split())  # the report wraps long lines
    assert broken.returncode != 0, report
    assert f"{_rule_name(rule)} BROKEN" in report, report
    assert chain in report, report


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle in the project: every module can be understood after what it imports.

    Imports under TYPE_CHECKING do not run and are left out."""
    sys.path.insert(0, str(REPO))
    try:
        graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    finally:
        sys.path.remove(str(REPO))
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported.split(".")[0] not in PACKAGES or imported == module:
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append(" -> ".join((module, *back)))
    assert cycles == [], "\n".join(cycles)


API_PROBE = """
import sys
from app.openapi.offline import offline_document
offline_document()  # create_app: every router, dependency and middleware, built
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("workers", "cli", "torch"))
print(",".join(loaded))
"""


def test_the_api_loads_no_module_of_the_clusters_side() -> None:
    """Importing the API and building it with create_app loads nothing of workers (nor the
    command, nor torch): the control plane runs none of the clusters' code."""
    done = subprocess.run(
        [sys.executable, "-c", API_PROBE],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stdout.strip() == "", done.stdout
