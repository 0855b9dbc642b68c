"""Checkpoints: the newest kept, everything restored, where two roles resume."""

from __future__ import annotations

from pathlib import Path

import torch

from workers.training.checkpoints import (
    CheckpointStore,
    restore_training_state,
    resume_step,
    training_state,
)


def test_checkpoints_keep_the_newest_and_restore_everything(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    rng = torch.Generator().manual_seed(7)
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(1, 5):
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        torch.rand(3, generator=rng)
        tensors, meta = training_state(model, opt, {"r": rng})
        store.save(step, tensors, {**meta, "step": step})
    assert store.steps() == [3, 4]
    expected = [p.detach().clone() for p in model.parameters()]
    next_draw = torch.rand(3, generator=rng)

    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_rng = torch.Generator()
    tensors, meta = store.load(4)
    assert meta["step"] == 4
    restore_training_state(tensors, meta, fresh, fresh_opt, {"r": fresh_rng})
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), expected, strict=True))
    assert torch.equal(torch.rand(3, generator=fresh_rng), next_draw)
    state = fresh_opt.state_dict()["state"][0]
    assert torch.equal(state["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_resume_step_is_the_newest_common_checkpoint() -> None:
    assert resume_step([], [10]) == 0
    assert resume_step([10, 20, 30], [10, 20]) == 20
