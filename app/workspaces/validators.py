"""The streaming validator of each dataset kind: text lines (formats.py) or a model
(hf_archive.py, which builds on formats.py)."""

from __future__ import annotations

from app.workspaces.formats import LinesValidator, Validator
from app.workspaces.hf_archive import ModelValidator
from app.workspaces.models import DatasetKind


def validator_for(kind: DatasetKind) -> Validator:
    """The streaming validator of one dataset kind."""
    if kind == DatasetKind.model:
        return ModelValidator()
    return LinesValidator(kind)
