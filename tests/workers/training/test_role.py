"""The role skeleton: hello and peer check, resume, the step loop's two ways to end, sync."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from workers.switch.link import LocalLink
from workers.training.hooks import Hooks
from workers.training.role import RoleLoop, StepSync


def loop_of(role: str, link: LocalLink, root: Path, hooks: Hooks | None = None) -> RoleLoop:
    return RoleLoop(
        role,
        link,
        hooks or Hooks(),
        root / role,
        steps=5,
        channel="t.hello",
        ckpt_every=2,
        keep_checkpoints=3,
        timeout_s=10,
    )


def hello_both(a: RoleLoop, b: RoleLoop, config_b: dict[str, int]) -> dict[str, object]:
    """Run b's hello in a thread (both send first), a's here; b's outcome comes back."""
    out: dict[str, object] = {}

    def other() -> None:
        try:
            out["peer"] = b.hello({"config": config_b, "seed": 0}, peer_role="a")
        except ValueError as exc:
            out["error"] = exc

    t = threading.Thread(target=other)
    t.start()
    try:
        a.hello({"config": {"x": 1}, "seed": 0}, peer_role="b")
    except ValueError as exc:
        out["mine"] = exc
    t.join(10)
    return out


def state() -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    return {"w": torch.ones(2)}, {}


def test_steps_checkpoints_and_resume_from_the_newest_common_step(tmp_path: Path) -> None:
    la, lb = LocalLink.pair()
    a, b = loop_of("a", la, tmp_path), loop_of("b", lb, tmp_path)
    assert "peer" in hello_both(a, b, {"x": 1})
    assert a.resume(lambda _t, _m: pytest.fail("nothing to resume")) == 0
    for k in a.steps():
        a.finished(k, state)
        a.report(k, {"k": float(k)})
    assert a.result.last_step == 5 and not a.result.stopped
    assert a.store.steps() == [2, 4, 5]  # every 2 steps and the last
    assert [h["k"] for h in a.result.history] == [1, 2, 3, 4, 5]

    # b holds step 2 only: both resume from 2, the newest step both hold
    b.store.save(2, *state())
    la, lb = LocalLink.pair()
    a, b = loop_of("a", la, tmp_path), loop_of("b", lb, tmp_path)
    hello_both(a, b, {"x": 1})
    restored: list[int] = []
    assert a.resume(lambda t, m: restored.append(int(m["step"]))) == 2
    assert restored == [2] and list(a.steps()) == [3, 4, 5]


def test_a_peer_with_another_config_is_refused_on_both_sides(tmp_path: Path) -> None:
    la, lb = LocalLink.pair()
    out = hello_both(loop_of("a", la, tmp_path), loop_of("b", lb, tmp_path), {"x": 2})
    assert "different configs or seeds" in str(out["mine"])
    assert "different configs or seeds" in str(out["error"])


def test_the_caller_or_the_peer_ends_the_loop(tmp_path: Path) -> None:
    asked = threading.Event()
    la, _ = LocalLink.pair()
    loop = loop_of("a", la, tmp_path, Hooks(should_stop=asked.is_set))
    ran = []
    for k in loop.steps():
        ran.append(k)
        if k == 2:
            asked.set()
    assert ran == [1, 2] and loop.cancelled and loop.result.stopped
    assert not loop.stopped_by_peer

    loop = loop_of("b", la, tmp_path)
    ran = []
    for k in loop.steps():
        ran.append(k)
        if k == 3:
            loop.peer_stopped()
    assert ran == [1, 2, 3] and loop.stopped_by_peer and not loop.cancelled


def test_step_sync_round_trip_is_sixteen_bytes() -> None:
    sync = StepSync(123_456, 0.25, 0.75, stop=True)
    payload = sync.to_payload()
    assert payload.numel() * payload.element_size() == 16
    assert StepSync.from_payload(payload) == sync
    with pytest.raises(ValueError, match="four or six numbers"):
        StepSync.from_payload(b"\x00" * 16)


def test_a_timed_step_sync_carries_two_timings_in_twenty_four_bytes() -> None:
    sync = StepSync(42, 0.5, 0.25, step_s=0.0625, waited_s=0.125)  # exact in float32
    payload = sync.to_payload()
    assert payload.numel() * payload.element_size() == 24
    assert StepSync.from_payload(payload) == sync
    assert StepSync.from_payload(StepSync(42, 0.5, 0.25).to_payload()).step_s is None
    for bad in (torch.zeros(5), torch.tensor([1.0, 0.0, 0.0, 0.0, -1.0, 0.0])):
        with pytest.raises(ValueError):
            StepSync.from_payload(bad)
    with pytest.raises(ValueError, match="finite"):
        StepSync.from_payload(torch.tensor([1.0, 0.0, 0.0, 0.0, float("inf"), 0.0]))


class _Config:
    """What `RoleLoop.of` reads of a scenario's config."""

    steps, ckpt_every, keep_checkpoints, recv_timeout_s = 5, 2, 3, 10.0


def test_a_served_role_passes_the_stop_on_and_reports_evaluations(tmp_path: Path) -> None:
    """The shape of ABNet's decoder: steps as the peer sends them, the stop passed on."""
    asked = threading.Event()
    seen: list[tuple[int, dict[str, float]]] = []
    hooks = Hooks(should_stop=asked.is_set, on_metrics=lambda k, m: seen.append((k, m)))
    la, _ = LocalLink.pair()
    loop = RoleLoop.of("t", _Config(), la, hooks, tmp_path / "t", channel="t.hello", eval_every=2)
    assert [k for k in range(1, 6) if loop.eval_due(k)] == [2, 4, 5]  # every 2 and the last
    sent_stop = []
    for k in (1, 2, 3):  # the peer sends three steps, then its stop
        assert loop.next_step == k
        if k == 2:
            asked.set()
        sent_stop.append(loop.stop_requested())
        asked.clear()  # asked once is asked for good
        loop.finished(k, state)
        loop.report(k, {"loss": 1.0 / k})
        if loop.eval_due(k):
            loop.report_eval(k, {"bleu": 10.0 * k})
    assert sent_stop == [False, True, True] and loop.cancelled
    result = loop.served()
    assert result.stopped and result.last_step == 3  # short of 5 steps
    assert result.history[1] == {"loss": 0.5, "bleu": 20.0} and result.extra == {"bleu": 20.0}
    assert seen[2] == (2, {"bleu": 20.0})
    assert loop.store.steps() == [2]  # ckpt_every 2
