"""The OpenAPI document as the server serves it, built from `create_app` with no server running.

The one module of app.openapi that imports the application: the builder (document.py) and the
marks (marks.py) sit below the routes, this sits above them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from app.main import create_app
from app.settings import Settings


def offline_document() -> dict[str, Any]:
    """The document the server serves, built with no database, broker or secret at hand."""
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(
            var_dir=Path(folder),
            # never connected to: building the document reads no data
            database_url=f"sqlite:///{Path(folder) / 'document.db'}",
            secret_key=SecretStr("the document needs no secret"),
            run_reaper=False,
        )
        app = create_app(settings)
        document = app.openapi()
        app.state.engine.dispose()
    return document
