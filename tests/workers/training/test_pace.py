"""`max_lag: auto`: the lead that hides the round trip, and what it is measured from."""

from __future__ import annotations

import pytest

from workers.training.electra.config import ElectraConfig
from workers.training.electra.pace import (
    AUTO_LAG_CAP,
    DEFAULT_LAG,
    AutoLag,
    auto_lag_cap,
    lead_for,
)


def test_the_lead_covers_the_round_trip_and_the_generators_step() -> None:
    # bench/README.md's figures: 50 ms round trip, G 22 ms, D 53 ms: lag 2 left D waiting,
    # 3 did not
    assert lead_for(0.050, 0.022, 0.053, cap=16) == 3
    assert lead_for(0.0, 0.010, 0.053, cap=16) == 2  # no link to hide: one step ahead
    assert lead_for(0.200, 0.010, 0.050, cap=16) == 6  # ceil(4.2) + 1
    assert lead_for(1.0, 0.010, 0.001, cap=16) == 16  # never past the cap
    assert lead_for(0.0, 0.0, 0.05, cap=16) == 1


@pytest.mark.parametrize(
    ("ckpt_every", "keep", "cap"), [(100, 3, AUTO_LAG_CAP), (4, 3, 8), (10, 2, 10), (1, 2, 1)]
)
def test_the_cap_keeps_a_checkpoint_both_roles_hold(ckpt_every: int, keep: int, cap: int) -> None:
    assert auto_lag_cap(ckpt_every, keep) == cap
    assert auto_lag_cap(ckpt_every, 1) == 1  # one checkpoint kept: the least lead there is
    # the generator `cap` steps ahead still holds the discriminator's newest checkpoint
    for d_step in range(ckpt_every, 200):
        g_step = d_step + cap
        d_newest = d_step // ckpt_every * ckpt_every
        g_kept = [g_step // ckpt_every * ckpt_every - i * ckpt_every for i in range(keep)]
        assert d_newest in g_kept, (d_step, g_step)


def test_auto_starts_at_the_default_and_measures_only_when_both_ends_waited() -> None:
    pace = AutoLag(cap=16)
    assert pace.lag == DEFAULT_LAG and pace.metrics() == {"max_lag": 2.0}
    pace.generator_stepped(0.010)
    # G's sync was already queued (G did not wait): its arrival time is unknown
    assert pace.synced(0.0, 0.500, 0.0, 0.050, 0.010) == DEFAULT_LAG
    # D's batch was already queued (D did not wait): its queueing time is not the link's
    assert pace.synced(0.0, 0.500, 0.010, 0.050, 0.0) == DEFAULT_LAG
    assert pace.rtt_s == type(pace.rtt_s)()
    # both waited: round trip 0.25 - 0.05 = 0.2 s, lag ceil((0.2 + 0.01) / 0.05) + 1 = 6
    assert pace.synced(0.0, 0.250, 0.010, 0.050, 0.010) == 6
    metrics = pace.metrics()
    assert metrics["max_lag"] == 6.0 and metrics["lag.rtt_s"] == pytest.approx(0.2)
    assert metrics["lag.discriminator_step_s"] == pytest.approx(0.05)


def test_auto_follows_the_measurements_down_as_well_as_up() -> None:
    pace = AutoLag(cap=16)
    pace.generator_stepped(0.010)
    for _ in range(3):
        pace.synced(0.0, 0.250, 0.01, 0.050, 0.01)  # 200 ms round trip
    assert pace.lag == 6
    for _ in range(10):  # the link got faster: the median follows
        pace.synced(0.0, 0.060, 0.01, 0.050, 0.01)
    assert pace.lag == 2


def test_the_config_takes_an_integer_or_auto() -> None:
    assert ElectraConfig.tiny().max_lag == DEFAULT_LAG
    assert ElectraConfig.tiny(max_lag="auto").max_lag == "auto"
    assert ElectraConfig.tiny(max_lag=5).max_lag == 5
    for bad in (0, -1, "fast", "3", 2.5, True):
        with pytest.raises(ValueError, match="max_lag"):
            ElectraConfig.tiny(max_lag=bad)
