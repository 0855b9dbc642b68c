"""The learning-rate schedule: linear warm-up, then linear decay to 10% of the peak."""

from __future__ import annotations

import pytest

from workers.training.schedule import linear_warmup_decay


def test_learning_rate_schedule() -> None:
    assert linear_warmup_decay(5, 1.0, 10, 100) == 0.5
    assert linear_warmup_decay(10, 1.0, 10, 100) == 1.0
    assert linear_warmup_decay(100, 1.0, 10, 100) == pytest.approx(0.1)
