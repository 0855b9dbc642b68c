"""The streaming validator of each dataset kind: lines (formats.py) or a model (hf_archive.py)."""

from __future__ import annotations

from app.datasets.formats import LinesValidator, Validator
from app.datasets.hf_archive import ModelValidator
from app.workspaces.models import DatasetKind


def validator_for(kind: DatasetKind) -> Validator:
    """The streaming validator of one dataset kind."""
    if kind == DatasetKind.model:
        return ModelValidator()
    return LinesValidator(kind)
