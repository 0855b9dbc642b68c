"""bench/table5.py's synchronous bound, B_sync, against a step worked out by hand."""

from __future__ import annotations

import pytest

from bench.table5 import ABNET, DELAY_MS, sync_bound_s


def test_a_link_bound_step_pays_the_fill_and_the_lighter_directions_micro_batch() -> None:
    micro, d = ABNET["micro_batches"], DELAY_MS / 1e3
    rate = 10.0  # Mbit/s: 1.25 MB/s
    forward, backward, c = 2_500_000.0, 1_250_000.0, 0.4
    # the activations take 2 s; the last one arrives after the first micro-batch's forward
    # (within c / micro), then the decoder's compute, the last gradient's 0.25 s and d each way
    x_last = backward / micro / 1.25e6
    expected = c / micro + forward / 1.25e6 + x_last + 2 * d
    assert sync_bound_s(c, forward, backward, rate) == pytest.approx(expected)
    # the directions swapped: the gradients' bytes wait for the first activations instead
    assert sync_bound_s(c, backward, forward, rate) == pytest.approx(expected)


def test_a_compute_bound_step_pays_one_crossing_each_way() -> None:
    micro, d = ABNET["micro_batches"], DELAY_MS / 1e3
    forward = backward = 1_250_000.0 / 100  # 10 ms a step each way at 10 Mbit/s
    c = 2.0
    x = forward / micro / 1.25e6
    assert sync_bound_s(c, forward, backward, 10.0) == pytest.approx(c + 2 * d + 2 * x)
