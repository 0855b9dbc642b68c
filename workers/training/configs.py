"""What a scenario's config class inherits: its constructors from presets and dicts.

`PresetConfig` gives `ElectraConfig` and `AbnetConfig` their constructors: a preset of
contract/presets.py with overrides, and a job's dict. Turning a job's configuration into
one of them is workers/training/job_config.py's, which imports both scenarios.
"""

from __future__ import annotations

from dataclasses import Field, fields
from typing import Any, ClassVar, Self

from contract.presets import preset_values


class PresetConfig:
    """Constructors of a scenario's config dataclass from its presets or a job's dict."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]]  # the scenario's table in contract.presets
    SCENARIO: ClassVar[str]  # what error messages call it
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a subclass is a dataclass

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Self:
        """Preset `name` (what contract.presets says it is for), with overrides."""
        return cls(**preset_values(cls.PRESETS, name, **overrides))

    @classmethod
    def tiny(cls, **overrides: Any) -> Self:
        """The `tiny` preset, the defaults: CPU minutes."""
        return cls.preset("tiny", **overrides)

    @classmethod
    def paper(cls, **overrides: Any) -> Self:
        """The `paper` preset: the paper's sizes, for GPUs."""
        return cls.preset("paper", **overrides)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Self:
        """The config a dict (e.g. a job's JSON) describes; unknown keys are an error."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown {cls.SCENARIO} config keys: {sorted(unknown)}")
        return cls(**values)
