"""When compression starts: `none` before a chosen step, the job's codec from then on."""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.compression.codecs import Codec
from workers.compression.spec import parse_spec


@dataclass(frozen=True)
class Schedule:
    """The codec of one tensor stream at each step: `before` until `compress_from_step`."""

    compress_from_step: int = 0
    spec: str = "fp16"
    before: str = "none"
    _codecs: dict[str, Codec] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.compress_from_step < 0:
            raise ValueError(f"compress_from_step must be >= 0, got {self.compress_from_step}")
        # parse now so that a bad spec fails when the job is set up, not at step N
        parse_spec(self.spec)
        parse_spec(self.before)

    def spec_at(self, step: int) -> str:
        """The spec in force at `step`."""
        return self.spec if step >= self.compress_from_step else self.before

    def codec_at(self, step: int) -> Codec:
        """The codec for `step`; the same instance every step, so warm state carries over."""
        spec = self.spec_at(step)
        if spec not in self._codecs:
            self._codecs[spec] = parse_spec(spec)
        return self._codecs[spec]
