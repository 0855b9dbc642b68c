"""Scenario-II: split ABNet against the single-process reference, frozen PLMs, what crosses, BLEU."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workers.compression import parse_spec
from workers.switch.link import Link, LinkEstimate
from workers.training.abnet import (
    ACT,
    AUTO_CANDIDATES,
    GRAD,
    HELLO,
    META,
    SYNC,
    AbnetConfig,
    EvalScore,
    StepSync,
    abnet_preset,
    bleu,
    run_abnet_decoder,
    run_abnet_encoder,
    train_abnet_local,
)
from workers.training.abnet.wire import unpack_coded, unpack_sync
from workers.training.electra import ElectraConfig, export_pretrained, train_electra_local
from workers.training.hooks import Hooks, RoleResult
from workers.training.messages import CodecBook, unpack_message

SEED = 5
LinkPairs = Callable[[str, str], tuple[Link, Link]]
RunRoles = Callable[..., Any]
Pairs = dict[str, tuple[list[str], list[str]]]


@pytest.fixture(scope="module")
def plm(text_lines: list[str]) -> bytes:
    """A briefly trained multilingual discriminator: enough to exercise the split runtime."""
    cfg = ElectraConfig.tiny(steps=3, batch_size=8, warmup_steps=1)
    run = train_electra_local(cfg, text_lines[:400], seed=1)
    return export_pretrained(run.discriminator.model, run.tokenizer)


def small(**overrides: object) -> AbnetConfig:
    base: dict[str, object] = dict(
        steps=20,
        batch_size=8,
        micro_batches=2,
        adapter_dim=32,
        warmup_steps=5,
        ckpt_every=10,
        forward_codec="none",
        backward_codec="none",
        eval_batch_size=8,
    )
    base.update(overrides)
    return AbnetConfig.tiny(**base)


def split_run(
    run_roles: RunRoles,
    cfg: AbnetConfig,
    links: tuple[Any, Any],
    plm: bytes,
    pairs: Pairs,
    root: Path,
    *,
    n_train: int = 200,
    n_eval: int = 0,
    s_hooks: Hooks | None = None,
    t_hooks: Hooks | None = None,
    target_plm: bytes | None = None,
) -> tuple[RoleResult, RoleResult]:
    src, tgt = pairs["train"][0][:n_train], pairs["train"][1][:n_train]
    eval_src = pairs["test"][0][:n_eval] if n_eval else None
    eval_tgt = pairs["test"][1][:n_eval] if n_eval else None
    s_link, t_link = links
    out = run_roles(
        lambda: run_abnet_encoder(
            cfg, s_link, src, plm, root / "s", s_hooks, eval_source_lines=eval_src, seed=SEED
        ),
        lambda: run_abnet_decoder(
            cfg,
            t_link,
            tgt,
            target_plm or plm,
            root / "t",
            t_hooks,
            eval_target_lines=eval_tgt,
            seed=SEED,
        ),
    )
    return out.a, out.b


def test_split_run_equals_single_process_reference(
    link_pairs: LinkPairs, run_roles: RunRoles, plm: bytes, pairs: Pairs, tmp_path: Path
) -> None:
    cfg = small()
    links = link_pairs("encoder", "decoder")
    s, t = split_run(run_roles, cfg, links, plm, pairs, tmp_path, n_eval=16)
    assert (s.last_step, t.last_step) == (20, 20)

    ref = train_abnet_local(
        cfg,
        plm,
        plm,
        pairs["train"][0][:200],
        pairs["train"][1][:200],
        eval_source_lines=pairs["test"][0][:16],
        eval_target_lines=pairs["test"][1][:16],
        seed=SEED,
    )
    for step, (r, h) in enumerate(zip(ref.history, t.history, strict=True), 1):
        for key in ("loss", "token_loss", "length_loss", "token_accuracy"):
            assert abs(r[key] - h[key]) <= 1e-6, (step, key)
    assert ref.bleu == t.extra["bleu"] == pytest.approx(s.extra["bleu"], abs=1e-4)

    for result, side in ((s, ref.encoder.model), (t, ref.decoder.model)):
        assert result.artifact is not None
        saved = load_file(str(result.artifact))
        trained = {n: p for n, p in side.named_parameters() if p.requires_grad}
        assert saved.keys() == trained.keys()
        for name, p in trained.items():
            torch.testing.assert_close(saved[name], p.detach(), rtol=0, atol=1e-6, msg=name)


def _trained(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def test_stale1_split_run_equals_its_delayed_update_reference(
    link_pairs: LinkPairs, run_roles: RunRoles, plm: bytes, pairs: Pairs, tmp_path: Path
) -> None:
    # however the next step's forwards and this step's gradients interleave (the test
    # below forces them to), the split run makes the reference's updates
    cfg = small(steps=6, micro_batches=3, schedule="stale1")
    s, t = split_run(
        run_roles, cfg, link_pairs("encoder", "decoder"), plm, pairs, tmp_path, n_eval=8
    )
    assert (s.last_step, t.last_step) == (6, 6) and not (s.stopped or t.stopped)
    src, tgt = pairs["train"][0][:200], pairs["train"][1][:200]
    evals = {"eval_source_lines": pairs["test"][0][:8], "eval_target_lines": pairs["test"][1][:8]}
    ref = train_abnet_local(cfg, plm, plm, src, tgt, seed=SEED, **evals)
    for step, (r, h) in enumerate(zip(ref.history, t.history, strict=True), 1):
        for key in ("loss", "token_loss", "length_loss", "token_accuracy"):
            assert abs(r[key] - h[key]) <= 1e-6, (step, key)
    assert [h["loss"] for h in s.history] == [h["loss"] for h in t.history]
    assert ref.bleu == t.extra["bleu"]  # the evaluation runs on the weights after update 6
    for result, side in ((s, ref.encoder.model), (t, ref.decoder.model)):
        assert result.artifact is not None
        saved, trained = load_file(str(result.artifact)), _trained(side)
        assert saved.keys() == trained.keys()
        for name, p in trained.items():
            torch.testing.assert_close(saved[name], p, rtol=0, atol=1e-6, msg=name)
    # T reports a step once S holds all its gradients, which may be two steps later:
    # every gradient byte is counted in its own step
    sent = [h["bytes_to_encoder"] for h in t.history]
    assert min(sent) > 0 and sum(sent) == t.history[-1]["bytes_to_encoder_total"]

    # the reference is not the synchronous one: step 2 already runs on the initial weights
    sync = train_abnet_local(small(steps=6, micro_batches=3), plm, plm, src, tgt, seed=SEED)
    assert sync.history[0]["loss"] == ref.history[0]["loss"]
    assert all(
        abs(a["loss"] - b["loss"]) > 1e-5
        for a, b in zip(sync.history[1:], ref.history[1:], strict=True)
    )
    stale, exact = _trained(ref.encoder.model), _trained(sync.encoder.model)
    assert max(float((stale[n] - exact[n]).abs().max()) for n in stale) > 1e-4


class _HeldGradients:
    """S's end of a link that hands over a step's last gradient only once S has sent the
    next step's first micro-batch: a schedule that waits for that gradient first hangs."""

    def __init__(self, inner: Link, cfg: AbnetConfig) -> None:
        self.inner, self.micro_batches = inner, cfg.micro_batches
        self.last = cfg.steps * cfg.micro_batches  # the last step has no next one
        self.metas = 0  # META messages sent: one per micro-batch, then the stop
        self.grads = 0
        self.sent = threading.Condition()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, channel: str, payload: Any) -> None:
        self.inner.send(channel, payload)
        with self.sent:
            self.metas += channel == META
            self.sent.notify_all()

    def recv(self, channel: str, timeout: float | None = None) -> Any:
        payload = self.inner.recv(channel, timeout)
        if channel == GRAD:
            self.grads += 1
            if self.grads % self.micro_batches == 0 and self.grads < self.last:
                with self.sent:  # a step's last gradient: held until the next step is on
                    if not self.sent.wait_for(lambda: self.metas > self.grads, timeout=10):
                        raise TimeoutError(f"S waited for gradient {self.grads} to go on")
        return payload


def test_under_stale1_the_next_steps_forwards_do_not_wait_for_the_last_gradient(
    run_roles: RunRoles, plm: bytes, pairs: Pairs, tmp_path: Path
) -> None:
    from workers.switch.link import LocalLink

    cfg = small(steps=3, schedule="stale1", recv_timeout_s=20.0)
    s_link, t_link = LocalLink.pair()
    held = _HeldGradients(s_link, cfg)
    s, t = split_run(run_roles, cfg, (held, t_link), plm, pairs, tmp_path)
    assert (s.last_step, t.last_step) == (3, 3) and held.grads == 6
    ref = train_abnet_local(
        cfg, plm, plm, pairs["train"][0][:200], pairs["train"][1][:200], seed=SEED
    )
    assert [h["loss"] for h in t.history] == pytest.approx(
        [h["loss"] for h in ref.history], abs=1e-6
    )


def test_stale1_applies_each_steps_gradient_at_the_weights_of_two_updates_before() -> None:
    """W_k = W_{k-1} - lr * grad f_k(W_{k-2}) with W_{-1} = W_0, on a model small enough to
    write out by hand (plain SGD in place of AdamW)."""
    from workers.training.abnet.stale import DelayedWeights

    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(3, 1)
    xs, ys = torch.randn(5, 4, 3, generator=gen), torch.randn(5, 4, 1, generator=gen)
    lr = 0.1
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    delayed = DelayedWeights(model)

    def loss(weights: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        out = torch.func.functional_call(model, weights, (xs[k - 1],))
        return ((out - ys[k - 1]) ** 2).mean()

    history = [{n: p.detach().clone() for n, p in model.named_parameters()}]  # W_0
    for k in range(1, 6):
        ((delayed(k, xs[k - 1]) - ys[k - 1]) ** 2).mean().backward()
        delayed.take_gradients(k)
        opt.step()
        opt.zero_grad(set_to_none=True)
        delayed.updated(k)
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})

    expected = dict(history[0])
    for k in range(1, 6):
        at = {n: t.clone().requires_grad_(True) for n, t in history[max(k - 2, 0)].items()}
        grads = torch.autograd.grad(loss(at, k), list(at.values()))
        expected = {n: expected[n] - lr * g for (n, _), g in zip(at.items(), grads, strict=True)}
        for name, w in expected.items():
            torch.testing.assert_close(history[k][name], w, msg=f"W_{k} {name}")


@pytest.mark.parametrize(
    "power", ["fp16(lowrank(0.3,method=power))", "fp16(lowrank(0.3,method=stream,refresh=3))"]
)
def test_split_run_with_a_stateful_codec_equals_the_reference_from_compress_from_step(
    link_pairs: LinkPairs,
    run_roles: RunRoles,
    plm: bytes,
    pairs: Pairs,
    tmp_path: Path,
    power: str,
) -> None:
    # power iteration warm-starts from the previous tensor of its stream, and a stream
    # basis is sent once for several chunks: equal figures need the same codec instance,
    # chunks and order on both ends of the pipeline
    cfg = small(steps=6, micro_batches=4, activation_chunks=2, compress_from_step=3)
    cfg = small(**{**asdict(cfg), "forward_codec": power, "backward_codec": "int8"})
    s, t = split_run(run_roles, cfg, link_pairs("encoder", "decoder"), plm, pairs, tmp_path)
    ref = train_abnet_local(
        cfg, plm, plm, pairs["train"][0][:200], pairs["train"][1][:200], seed=SEED
    )
    for step, (r, h) in enumerate(zip(ref.history, t.history, strict=True), 1):
        for key in ("loss", "token_loss", "length_loss", "token_accuracy"):
            assert abs(r[key] - h[key]) <= 1e-5, (step, key)
    # float32 before step 3, low rank from then on: the forward bytes drop at step 3
    # (each step's bytes follow its sentences' lengths: only valid positions cross)
    sent = [h["bytes_to_decoder"] for h in s.history]
    assert max(sent[2:]) < 0.5 * min(sent[:2])
    assert [h["loss"] for h in s.history] == [h["loss"] for h in t.history]


class _Measured:
    """A link whose switches report `estimate` (LocalLink measures nothing)."""

    def __init__(self, inner: Link, estimate: LinkEstimate) -> None:
        self.inner, self.estimate = inner, estimate

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def link_estimate(self) -> LinkEstimate:
        return self.estimate


def test_auto_codecs_choose_within_the_error_bound_and_report_the_choice(
    run_roles: RunRoles, plm: bytes, pairs: Pairs, tmp_path: Path
) -> None:
    from workers.switch.link import LocalLink

    cfg = small(steps=3, forward_codec="auto", backward_codec="auto", auto_max_error=0.05)
    # no measurement yet: the fewest bytes within the bound, as the reference picks
    s, t = split_run(run_roles, cfg, LocalLink.pair(), plm, pairs, tmp_path / "unmeasured")
    ref = train_abnet_local(
        cfg, plm, plm, pairs["train"][0][:200], pairs["train"][1][:200], seed=SEED
    )
    assert [h["loss"] for h in t.history] == pytest.approx(
        [h["loss"] for h in ref.history], abs=1e-5
    )
    for side, stream in ((s, "forward"), (t, "backward")):
        last = side.history[-1]
        chosen = AUTO_CANDIDATES[int(last[f"auto.{stream}.choice"])]
        assert chosen != "none"  # float32 is the most bytes of all
        assert 0 < last[f"auto.{stream}.rel_error"] <= 0.05
        assert 0 < last[f"auto.{stream}.measured_error"] <= 0.05  # on the live tensor
        assert last[f"auto.{stream}.profiles"] >= 1
        assert last[f"auto.{stream}.measured"] == 0.0
    # a slow measured link: transfer dominates, so the same fewest-bytes choice, now measured
    slow = LinkEstimate(bandwidth_bytes_per_s=1000.0, rtt_s=0.04, samples=5)
    a, b = LocalLink.pair()
    s2, _ = split_run(
        run_roles, cfg, (_Measured(a, slow), _Measured(b, slow)), plm, pairs, tmp_path / "slow"
    )
    last = s2.history[-1]
    assert last["auto.forward.measured"] == 1.0
    assert last["auto.forward.bandwidth_mbit"] == pytest.approx(0.008)
    assert last["auto.forward.choice"] == s.history[-1]["auto.forward.choice"]
    with pytest.raises(ValueError, match="per-sample"):
        small(backward_codec="ef(int8)")


def test_only_adapters_change(plm: bytes, pairs: Pairs) -> None:
    from workers.training.electra import load_pretrained

    cfg = small(steps=5)
    ref = train_abnet_local(cfg, plm, plm, pairs["train"][0][:100], pairs["train"][1][:100])
    pristine = load_pretrained(plm).discriminator.body.state_dict()
    for side in (ref.encoder.model, ref.decoder.model):
        frozen = side.plm.state_dict()
        assert frozen.keys() == pristine.keys()
        for key, value in frozen.items():
            assert torch.equal(value, pristine[key]), key  # bit-identical
        assert all(not p.requires_grad for p in side.plm.parameters())
    # the decoder's adapters did move (the up-projections start at zero)
    up = ref.decoder.model.after_ffn[0].up.weight
    assert float(up.detach().abs().max()) > 0


def test_neither_cluster_receives_the_other_sides_tokens(
    link_pairs: LinkPairs,
    run_roles: RunRoles,
    recording: type,
    plm: bytes,
    pairs: Pairs,
    tmp_path: Path,
) -> None:
    cfg = small(steps=4, forward_codec="fp16", backward_codec="int8")
    s_inner, t_inner = link_pairs("encoder", "decoder")
    s_link, t_link = recording(s_inner), recording(t_inner)
    n = 64
    _, t = split_run(run_roles, cfg, (s_link, t_link), plm, pairs, tmp_path, n_train=n, n_eval=8)
    assert t.last_step == 4

    src_text = pairs["train"][0][:n] + pairs["test"][0][:8]
    tgt_text = pairs["train"][1][:n] + pairs["test"][1][:8]
    # words only one side has (names and cities are shared by both languages); five
    # letters or more, so that float bytes cannot spell one by chance
    src_vocab = {w.strip(".") for line in src_text for w in line.split()}
    tgt_vocab = {w.strip(".") for line in tgt_text for w in line.split()}
    src_words = {w for w in src_vocab - tgt_vocab if len(w.encode()) >= 5}
    tgt_words = {w for w in tgt_vocab - src_vocab if len(w.encode()) >= 5}
    assert len(src_words) > 20 and len(tgt_words) > 20

    # what S received: the hello, gradients of its own activations, sync tensors
    assert {ch for ch, _ in s_link.received} == {HELLO, GRAD, SYNC}
    for ch, payload in s_link.received:
        if ch == GRAD:
            coded = unpack_coded(payload)
            assert coded.spec == "int8"
            g = parse_spec("int8").decode(coded.blob)
            # the valid positions of a micro-batch only: (sum of its lengths, width)
            assert g.dtype == torch.float32 and g.dim() == 2
            assert g.shape[0] <= cfg.batch_size * cfg.src_len
        elif ch == SYNC:
            assert isinstance(payload, bytes)
            assert isinstance(unpack_sync(payload), StepSync | EvalScore)
        else:
            assert isinstance(payload, bytes)
            header, arrays = unpack_message(payload)
            assert arrays == {}
            assert set(header) == {"role", "config", "seed", "n_train", "n_eval", "checkpoints"}
        assert not any(_contains(payload, w) for w in tgt_words)

    # what T received: the hello, pair indices and source lengths, encoded activations
    assert {ch for ch, _ in t_link.received} == {HELLO, META, ACT}
    for ch, payload in t_link.received:
        assert isinstance(payload, bytes)
        if ch == META:
            header, arrays = unpack_message(payload)
            assert set(arrays) <= {"index", "src_len"}
            assert all(a.dtype.kind == "u" for a in arrays.values())
            if "src_len" in arrays:
                assert int(arrays["src_len"].max()) <= cfg.src_len
        assert not any(_contains(payload, w) for w in src_words)


def _contains(payload: Any, word: str) -> bool:
    raw = payload.numpy().tobytes() if isinstance(payload, torch.Tensor) else payload
    return word.encode("utf-8") in raw


def _stopping_after(last: int) -> Hooks:
    """Hooks that ask the role to stop once it has reported step `last`."""
    seen = {"step": 0}

    def on_metrics(step: int, _values: dict[str, float]) -> None:
        seen["step"] = step

    return Hooks(on_metrics=on_metrics, should_stop=lambda: seen["step"] >= last)


def test_resume_reproduces_the_uninterrupted_run(
    run_roles: RunRoles, plm: bytes, pairs: Pairs, tmp_path: Path
) -> None:
    from workers.switch.link import LocalLink

    cfg = small(steps=6, ckpt_every=3)
    _, t_full = split_run(run_roles, cfg, LocalLink.pair(), plm, pairs, tmp_path / "full")

    root = tmp_path / "cut"
    s1, t1 = split_run(
        run_roles, cfg, LocalLink.pair(), plm, pairs, root, t_hooks=_stopping_after(3)
    )
    assert s1.stopped and t1.stopped and t1.last_step < 6
    s2, t2 = split_run(run_roles, cfg, LocalLink.pair(), plm, pairs, root)
    assert (s2.start_step, t2.start_step) == (3, 3)
    assert [h["loss"] for h in t2.history] == [h["loss"] for h in t_full.history[3:]]
    assert t2.artifact is not None
    a, b = (
        load_file(str(t2.artifact)),
        load_file(str(tmp_path / "full" / "t" / "adapters.safetensors")),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_stale1_run_resumes_with_the_weights_its_next_step_runs_on(
    run_roles: RunRoles, plm: bytes, pairs: Pairs, tmp_path: Path
) -> None:
    from workers.switch.link import LocalLink

    cfg = small(steps=6, ckpt_every=3, schedule="stale1")
    s_full, t_full = split_run(run_roles, cfg, LocalLink.pair(), plm, pairs, tmp_path / "full")

    # S hears of step 3 after step 4's forwards, and stops there: the checkpoint of step
    # 3 must hold the weights step 4 runs on (those after update 2), not the live ones
    root = tmp_path / "cut"
    s1, t1 = split_run(
        run_roles, cfg, LocalLink.pair(), plm, pairs, root, s_hooks=_stopping_after(3)
    )
    assert s1.stopped and t1.stopped and (s1.last_step, t1.last_step) == (4, 4)
    s2, t2 = split_run(run_roles, cfg, LocalLink.pair(), plm, pairs, root)
    assert (s2.start_step, t2.start_step) == (3, 3)
    assert [h["loss"] for h in t2.history] == [h["loss"] for h in t_full.history[3:]]
    for resumed, full in ((s2, s_full), (t2, t_full)):
        assert resumed.artifact is not None and full.artifact is not None
        a, b = load_file(str(resumed.artifact)), load_file(str(full.artifact))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_mismatched_sides_are_refused(
    run_roles: RunRoles, plm: bytes, pairs: Pairs, tmp_path: Path
) -> None:
    from workers.switch.link import LocalLink

    s_link, t_link = LocalLink.pair()
    cfg = small(steps=2)
    with pytest.raises(AssertionError, match="differ in length"):
        run_roles(
            lambda: run_abnet_encoder(cfg, s_link, pairs["train"][0][:50], plm, tmp_path / "s"),
            lambda: run_abnet_decoder(cfg, t_link, pairs["train"][1][:40], plm, tmp_path / "t"),
        )


def test_codec_schedule_and_presets() -> None:
    cfg = abnet_preset("tiny", compress_from_step=10)
    assert (cfg.schedule, cfg.staleness) == ("sync", 0)
    assert abnet_preset("tiny", schedule="stale1").staleness == 1
    with pytest.raises(ValueError, match="schedule must be sync or stale1, got 'stale2'"):
        abnet_preset("tiny", schedule="stale2")
    assert cfg.codecs(9) == ("none", "none")
    assert cfg.codecs(10) == ("fp16", "int8")
    assert abnet_preset("paper").adapter_dim > cfg.adapter_dim
    x = torch.randn(2, 3, 4)
    book = CodecBook()
    assert torch.equal(book.get("forward", "none").decode(book.get("forward", "none").encode(x)), x)


def test_a_role_keeps_one_codec_per_stream_so_warm_starts_carry_over() -> None:
    book = CodecBook()
    spec = "fp16(lowrank(0.2,method=power))"
    assert book.get("forward", spec) is book.get("forward", spec)
    assert book.get("eval", spec) is not book.get("forward", spec)
    # a stream of slowly drifting activations: the warm codec ends closer to optimal than a cold one
    gen = torch.Generator().manual_seed(0)
    basis = torch.randn(256, 16, generator=gen)
    warm, errors_warm, errors_cold = book.get("forward", spec), [], []
    for step in range(6):
        x = basis @ torch.randn(16, 64, generator=gen) + 0.01 * step * torch.randn(
            256, 64, generator=gen
        )
        for codec, errors in ((warm, errors_warm), (CodecBook().get("forward", spec), errors_cold)):
            y = codec.decode(codec.encode(x))
            errors.append(float((y - x).norm() / x.norm()))
    assert errors_warm[-1] < errors_cold[-1]
    assert bleu(["the cat is red."], ["the cat is red."]) == pytest.approx(100.0)
    assert np.isclose(bleu(["a b c d"], ["w x y z"]), 0.0)


@pytest.mark.slow
def test_tiny_preset_translates_the_demo_test_split(
    tiny_electra: tuple[RoleResult, RoleResult], run_roles: RunRoles, pairs: Pairs, tmp_path: Path
) -> None:
    """The demo's story: the ELECTRA job's discriminator, loaded on both sides, fine-tuned."""
    from workers.switch.link import LocalLink

    _, d = tiny_electra
    assert d.artifact is not None
    model = d.artifact.read_bytes()  # multilingual: source and target PLM are the same file
    cfg = AbnetConfig.tiny()  # fp16 activations, int8 gradients
    s, t = split_run(
        run_roles, cfg, LocalLink.pair(), model, pairs, tmp_path, n_train=3000, n_eval=200
    )
    assert t.last_step == cfg.steps
    losses = [h["loss"] for h in t.history]
    assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:5]) / 5
    assert t.extra["bleu"] > 5.0
    assert s.extra["bleu"] == pytest.approx(t.extra["bleu"], abs=1e-3)


def test_the_eval_stream_starts_from_the_training_streams_basis() -> None:
    from workers.compression import LowRankCodec, relative_error
    from workers.training.abnet.wire import FORWARD, StreamDecoder, StreamEncoder

    spec = "fp16(lowrank(0.2,method=power))"
    cfg = small(forward_codec=spec)
    train = StreamEncoder(cfg, "forward", FORWARD)
    warm = StreamEncoder(cfg, "eval", FORWARD, warm_source=train)
    cold = StreamEncoder(cfg, "eval", FORWARD)
    decoder = StreamDecoder(cfg, "eval", FORWARD)
    gen = torch.Generator().manual_seed(3)
    # activations of one slowly moving spectrum: 1/i over 64 directions, width 64 (k = 13)
    u = torch.linalg.qr(torch.randn(64, 64, generator=gen)).Q / torch.arange(1, 65)

    def batch() -> torch.Tensor:
        return (torch.randn(8, 24, 64, generator=gen) @ u.T).contiguous()

    for step in range(1, 9):
        train.encode(step, batch())
    x = batch()
    shape = tuple(x.shape)
    err_warm = relative_error(x, decoder.decode(warm.encode(8, x), shape, x.numel()))
    err_cold = relative_error(x, decoder.decode(cold.encode(8, x), shape, x.numel()))
    source = train.book.get("forward", spec)
    target = warm.book.get("eval", spec)
    assert isinstance(source, LowRankCodec) and isinstance(target, LowRankCodec)
    assert err_warm < 0.9 * err_cold


def test_the_eval_stream_of_a_stream_basis_starts_from_the_training_covariance() -> None:
    """Its first chunk carries a basis made from the training stream's covariance, so a
    fresh eval decoder reads it, and the chunks after it cross without a basis of their
    own, as well coded as the training subspace allows; a cold eval stream's first basis
    is made of its first chunk's rows alone, and the next chunk sends another."""
    from workers.compression import StreamBasisCodec, relative_error
    from workers.training.abnet.wire import FORWARD, StreamDecoder, StreamEncoder

    spec = "fp16(lowrank(0.2,method=stream))"
    cfg = small(forward_codec=spec)
    train = StreamEncoder(cfg, "forward", FORWARD)
    warm = StreamEncoder(cfg, "eval", FORWARD, warm_source=train)
    cold = StreamEncoder(cfg, "eval", FORWARD)
    gen = torch.Generator().manual_seed(3)
    q = torch.linalg.qr(torch.randn(64, 64, generator=gen)).Q
    u = q / torch.arange(1, 65)  # a spectrum of 1/i; its best 13 directions: q's first 13

    def chunk(rows: int) -> torch.Tensor:
        return (torch.randn(rows, 64, generator=gen) @ u.T).contiguous()

    for step in range(1, 41):
        train.encode(step, chunk(24))
    first, second = chunk(6), chunk(200)
    sizes = {}
    for name, encoder in (("warm", warm), ("cold", cold)):
        decoder = StreamDecoder(cfg, "eval", FORWARD)
        decoder.decode(encoder.encode(40, first), (6, 64), first.numel())
        coded = encoder.encode(40, second)
        sizes[name] = len(coded.blob)
        got = decoder.decode(coded, (200, 64), second.numel())
        if name == "warm":
            best = relative_error(second, second @ q[:, :13] @ q[:, :13].T)
            assert relative_error(second, got) < 1.1 * best
    assert sizes["warm"] < sizes["cold"]
    source, target = train.book.get("forward", spec), warm.book.get("eval", spec)
    assert isinstance(source, StreamBasisCodec) and isinstance(target, StreamBasisCodec)


def test_power_iteration_stays_warm_across_chunks_of_other_lengths() -> None:
    """Packed without their padding, the chunks of a stream have as many rows as their
    sentences have tokens, so k (0.2 of the rows) and the warm start's width change from
    chunk to chunk; the training stream keeps its basis, and so does the eval stream that
    starts from it with chunks ten times longer."""
    from workers.compression import LowRankCodec, relative_error
    from workers.training.abnet.wire import (
        FORWARD,
        StreamDecoder,
        StreamEncoder,
        pack_valid,
        round_trip,
    )

    spec = "fp16(lowrank(0.2,method=power))"
    cfg = small(forward_codec=spec)
    train, decoder = StreamEncoder(cfg, "forward", FORWARD), StreamDecoder(cfg, "forward", FORWARD)
    warm = StreamEncoder(cfg, "eval", FORWARD, warm_source=train)
    gen = torch.Generator().manual_seed(4)
    # activations of one spectrum, 1/i over 64 directions, 64 wide; sentences of 3-8 tokens
    u = torch.linalg.qr(torch.randn(64, 64, generator=gen)).Q / torch.arange(1, 65)

    def batch(sentences: int) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.randint(3, 9, (sentences,), generator=gen)
        return torch.randn(sentences, 8, 64, generator=gen) @ u.T, lengths

    def error(encoder: StreamEncoder, x: torch.Tensor) -> float:
        coded = encoder.encode(8, x)
        return relative_error(x, decoder.decode(coded, tuple(x.shape), x.numel()))

    codec = train.book.get("forward", spec)
    assert isinstance(codec, LowRankCodec)
    widths = set()
    for step in range(1, 9):
        x, lengths = batch(8)
        round_trip(train, decoder, step, x, 2, lengths)
        assert codec.warm_start is not None
        widths.add(codec.warm_start.shape[-1])
    assert len(widths) > 1
    chunk = pack_valid(*batch(4))  # 12-32 rows: k = 3-7
    assert error(train, chunk) < 0.9 * error(StreamEncoder(cfg, "forward", FORWARD), chunk)
    x = pack_valid(*batch(40))  # 120-320 rows: k = 13 (0.2 of 64 columns)
    assert error(warm, x) < 0.9 * error(StreamEncoder(cfg, "eval", FORWARD), x)


def _padded_reference(
    cfg: AbnetConfig, plm: bytes, pairs: Pairs, steps: int
) -> list[dict[str, float]]:
    """ABNet trained with the whole padded (B, S, C) tensors handed across, no codec."""
    from workers.training.abnet.sides import DecoderSide, EncoderSide, step_metrics
    from workers.training.electra import load_pretrained

    enc = EncoderSide(cfg, load_pretrained(plm), pairs["train"][0][:200], SEED, "cpu")
    dec = DecoderSide(cfg, load_pretrained(plm), pairs["train"][1][:200], enc.d_model, SEED, "cpu")
    history = []
    for k in range(1, steps + 1):
        stats = []
        for m in range(cfg.micro_batches):
            index = enc.indices(k, m)
            h, src_len = enc.forward(enc.data[index])
            grad, st = dec.train_micro(index, h.detach().clone(), src_len)
            h.backward(grad)
            stats.append(st)
        enc.step(k)
        dec.step(k)
        history.append(step_metrics(stats))
    return history


def test_padding_free_crossings_equal_the_padded_reference(plm: bytes, pairs: Pairs) -> None:
    cfg = small(steps=4)
    padded = _padded_reference(cfg, plm, pairs, 4)
    run = train_abnet_local(
        cfg, plm, plm, pairs["train"][0][:200], pairs["train"][1][:200], seed=SEED
    )
    for step, (r, h) in enumerate(zip(padded, run.history, strict=True), 1):
        for key in ("loss", "token_loss", "length_loss", "token_accuracy"):
            assert abs(r[key] - h[key]) <= 1e-6, (step, key)


def test_only_valid_positions_cross_and_the_padding_is_rebuilt() -> None:
    from workers.training.abnet.wire import (
        FORWARD,
        StreamDecoder,
        StreamEncoder,
        pack_valid,
        round_trip,
        unpack_valid,
    )

    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 0, 5, 1])
    x = torch.randn(4, 6, 8, generator=gen)
    packed = pack_valid(x, lengths)
    assert packed.shape == (9, 8)
    assert torch.equal(packed[:3], x[0, :3]) and torch.equal(packed[3:8], x[2, :5])
    rebuilt = unpack_valid(packed, lengths, 6)
    mask = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)
    assert torch.equal(rebuilt[mask], x[mask]) and not rebuilt[~mask].any()
    # what crosses for a whole batch: the valid rows, chunk by chunk, in fewer bytes
    cfg = small(forward_codec="none")
    encoder, decoder = (
        StreamEncoder(cfg, "forward", FORWARD),
        StreamDecoder(cfg, "forward", FORWARD),
    )
    out = round_trip(encoder, decoder, 1, x, 2, lengths)
    assert torch.equal(out, rebuilt)
    assert len(encoder.encode(1, pack_valid(x, lengths)).blob) < len(encoder.encode(1, x).blob) / 2


@pytest.mark.parametrize(
    ("lengths", "positions", "reason"),
    [
        ([3, 7, 2], 6, "exceeds the tensor's 6 positions"),
        ([3, 2, 2], 0, "claims 0 positions"),
        ([3, 2, 2], 25, "claims 25 positions, the limit is 24"),
    ],
)
def test_a_frame_whose_lengths_do_not_fit_is_refused_before_allocation(
    lengths: list[int], positions: int, reason: str
) -> None:
    from workers.training.abnet.wire import Batch, Kind, pack_meta, unpack_meta

    batch = Batch(Kind.TRAIN, 1, 0, torch.arange(3), torch.tensor(lengths), 1, positions)
    with pytest.raises(ValueError, match=reason):
        unpack_meta(pack_meta(batch, 10, 255), max_chunks=4, max_len=24)


def test_lengths_summing_past_the_batch_or_a_blob_past_them_are_refused() -> None:
    from workers.compression import WireError
    from workers.training.abnet.wire import (
        FORWARD,
        StreamDecoder,
        StreamEncoder,
        check_lengths,
        pack_valid,
    )

    with pytest.raises(ValueError, match="sum to 13, more than the batch's 12 positions"):
        check_lengths(torch.tensor([4, 4, 5]), 4, 24)
    with pytest.raises(ValueError, match="negative"):
        check_lengths(torch.tensor([4, -1, 2]), 4, 24)
    cfg = small(forward_codec="none")
    encoder, decoder = (
        StreamEncoder(cfg, "forward", FORWARD),
        StreamDecoder(cfg, "forward", FORWARD),
    )
    x = torch.randn(3, 6, 8)
    coded = encoder.encode(1, pack_valid(x, torch.tensor([6, 6, 6])))  # 18 rows
    with pytest.raises(WireError, match=r"claims shape \(18, 8\), the stream expects \(9, 8\)"):
        decoder.decode(coded, (9, 8), 9 * 8)  # the lengths the meta declared sum to 9
