"""The build step that puts the web UI and the migrations inside the package
(pyproject.toml has the rest).

`python -m build --wheel` (or `pip wheel .`) copies the built single-page app,
frontend/dist, into the wheel as app/static: the control plane then serves `/` from the
installed package, with no Node on its host. Build the UI first where Node is
(`make frontend`). NEBULA_WHEEL_WITHOUT_UI=1 builds a wheel without it (API only);
otherwise a missing frontend/dist/index.html fails the build rather than ship a wheel
that answers 404 at `/`. migrations/ goes in as app/migrations, so that `nebula db
upgrade` works from the installed wheel.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
DIST = HERE / "frontend" / "dist"


class BuildWithUI(build_py):
    """build_py, then frontend/dist copied to <build>/app/static, migrations/ to
    <build>/app/migrations."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads both from the checkout
        migrations = Path(self.build_lib) / "app" / "migrations"
        if migrations.exists():
            shutil.rmtree(migrations)
        shutil.copytree(
            HERE / "migrations", migrations, ignore=shutil.ignore_patterns("__pycache__")
        )
        if not (DIST / "index.html").is_file():
            if os.environ.get("NEBULA_WHEEL_WITHOUT_UI") == "1":
                return
            raise SystemExit(
                "frontend/dist/index.html is missing: run `make frontend` first (needs Node), "
                "or set NEBULA_WHEEL_WITHOUT_UI=1 for a wheel without the web UI"
            )
        target = Path(self.build_lib) / "app" / "static"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(DIST, target)


setup(cmdclass={"build_py": BuildWithUI})
