"""ABNet's two roles over a `Link`: the encoder on cluster S, the decoder on cluster T.

S reads only source lines, T only target lines; the i-th lines of both are a pair,
and S tells T which indices a micro-batch holds. Each step is a 1F1B pipeline of
`micro_batches` micro-batches: S runs forwards while gradients are out and runs each
backward as soon as its gradient lands; T trains on each micro-batch as it arrives.
Encoding happens on the sending thread and decoding on the receiving thread of each
side (workers/training/pipeline.py), so compute never waits on a codec, and
activations cross in chunks so T decodes one while the next is on the wire.

There is no barrier between steps: S starts step k+1 as soon as its own optimizer
step k is done and reads T's `StepSync` of step k one step later. A stop T asks for
therefore takes effect after S's current step; T serves whatever S sends until S's
`stop`. Gradients are accumulated in micro-batch order, as `train_abnet_local` does
in one process, so a split run equals it codec for codec.

With `schedule: stale1` S does not wait for step k's last gradients: step k+1's
forwards run on the weights after update k - 1 (workers/training/abnet/stale.py), so
S waits only for step k - 1's before them, and applies update k when step k's last
gradient lands, between step k+1's forwards. Before a checkpoint, an evaluation and
its stop S waits for them all, so a checkpoint or an evaluation after step k sees
update k, as under `sync`.

Both roles stand on `RoleLoop` (workers/training/role.py) for the hello and peer
check, resume, checkpoints and metrics: S iterates `loop.steps()`; T is driven by
what S sends and ends with `loop.served()`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from workers.switch.link import Link
from workers.training.abnet.artifact import save_adapters
from workers.training.abnet.config import AbnetConfig
from workers.training.abnet.sides import (
    DecoderSide,
    DecoderStats,
    EncoderSide,
    bleu,
    check_lines,
    step_metrics,
)
from workers.training.abnet.wire import (
    ACT,
    BACKWARD,
    FORWARD,
    GRAD,
    HELLO,
    META,
    SYNC,
    Batch,
    ByteCount,
    Control,
    EvalScore,
    Kind,
    StepSync,
    StreamDecoder,
    StreamEncoder,
    auto_metrics,
    chunks,
    pack_coded,
    pack_meta,
    pack_sync,
    pack_valid,
    unpack_coded,
    unpack_meta,
    unpack_sync,
    unpack_valid,
)
from workers.training.checkpoints import restore_training_state, training_state
from workers.training.data import encode_lines
from workers.training.electra import load_pretrained
from workers.training.hooks import Hooks, RoleResult
from workers.training.messages import expect_bytes
from workers.training.pipeline import Source, Stage
from workers.training.role import RoleLoop, TrainingState

ENCODER, DECODER = "abnet-encoder", "abnet-decoder"


def _loop(role: str, cfg: AbnetConfig, link: Link, hooks: Hooks | None, ckpt_dir: Path) -> RoleLoop:
    return RoleLoop.of(
        role, cfg, link, hooks or Hooks(), ckpt_dir, channel=HELLO, eval_every=cfg.eval_every
    )


def _hello(loop: RoleLoop, mine: dict[str, Any], peer_role: str) -> dict[str, Any]:
    """`loop.hello`, and the peer's side must hold as many training and eval pairs."""
    peer = loop.hello(mine, peer_role=peer_role, what="ABNet roles")
    if (peer["n_train"], peer["n_eval"]) != (mine["n_train"], mine["n_eval"]):
        raise ValueError(
            "source and target sides differ in length: "
            f"{mine['n_train']}/{mine['n_eval']} vs {peer['n_train']}/{peer['n_eval']} lines"
        )
    return peer


def _state(side: EncoderSide | DecoderSide) -> Callable[[], TrainingState]:
    """What a checkpoint of `side` holds: its adapters (the PLM is frozen), optimizer, RNG."""
    return lambda: training_state(side.model, side.opt, side.generators(), trainable_only=True)


def _encoder_state(side: EncoderSide, step: int) -> Callable[[], TrainingState]:
    """`_state`, and under `stale1` the weights step `step + 1`'s forwards run on."""

    def state() -> TrainingState:
        tensors, meta = _state(side)()
        if side.delayed is not None:
            tensors.update(side.delayed.state(step))
        return tensors, meta

    return state


def _restore(
    side: EncoderSide | DecoderSide,
) -> Callable[[dict[str, torch.Tensor], dict[str, Any]], None]:
    """Put what `_state` saved back into `side` (and what `_encoder_state` added)."""

    def restore(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        restore_training_state(tensors, meta, side.model, side.opt, side.generators())
        if isinstance(side, EncoderSide) and side.delayed is not None:
            side.delayed.restore(int(meta["step"]), tensors)

    return restore


# ---------------------------------------------------------------- the encoder role (cluster S)


class _Encoder:
    """S's loop: 1F1B over the micro-batches, a sending and a gradient-receiving thread."""

    def __init__(
        self,
        cfg: AbnetConfig,
        side: EncoderSide,
        loop: RoleLoop,
        eval_ids: torch.Tensor | None,
    ) -> None:
        self.cfg, self.side, self.loop, self.link = cfg, side, loop, loop.link
        self.eval_ids = eval_ids
        self.max_index = max(len(side.data), len(eval_ids) if eval_ids is not None else 0)
        train = StreamEncoder(cfg, "forward", FORWARD, self.link.link_estimate)
        self.encoders = {
            Kind.TRAIN: train,
            Kind.EVAL: StreamEncoder(
                cfg, "eval", FORWARD, self.link.link_estimate, warm_source=train
            ),
        }
        self.grad_decoder = StreamDecoder(cfg, "backward", BACKWARD)
        self.sent = ByteCount()
        self.choices: dict[int, dict[str, float]] = {}
        self.sender: Stage[tuple[Batch, torch.Tensor] | Control, None] = Stage(
            "abnet-encoder-send", self._send
        )
        # every micro-batch whose gradient is out has its entry queued: a step's, and
        # under stale1 the previous step's too
        self.grads: Stage[tuple[int, tuple[int, ...], torch.Tensor], torch.Tensor] = Stage(
            "abnet-encoder-recv",
            self._receive_grad,
            depth=max(16, (1 + cfg.staleness) * cfg.micro_batches),
        )
        self.pending: deque[tuple[int, int, torch.Tensor]] = deque()  # (step, micro, h)
        self.synced = loop.result.start_step  # T's StepSyncs read through this step
        self.stop_asked = False  # a StepSync asked S to stop
        self.step_seconds: dict[int, float] = {}

    # -- the helper threads

    def _send(self, item: tuple[Batch, torch.Tensor] | Control) -> None:
        if isinstance(item, Control):
            self.link.send(META, pack_meta(item, self.max_index, self.cfg.src_len))
            return
        batch, h = item
        meta = pack_meta(batch, self.max_index, self.cfg.src_len)
        self.link.send(META, meta)
        n = len(meta)
        encoder = self.encoders[batch.kind]
        pieces = zip(chunks(h, batch.chunks), chunks(batch.src_len, batch.chunks), strict=True)
        for piece, lengths in pieces:
            # only the valid positions cross; T rebuilds the padding from the lengths
            payload = pack_coded(encoder.encode(batch.step, pack_valid(piece, lengths)))
            self.link.send(ACT, payload)
            n += len(payload)
        self.sent.add(batch.kind, batch.step, n)
        if batch.kind == Kind.TRAIN:
            self.choices[batch.step] = auto_metrics("forward", encoder)

    def _receive_grad(self, expected: tuple[int, tuple[int, ...], torch.Tensor]) -> torch.Tensor:
        step, (_, positions, width), lengths = expected
        coded = unpack_coded(self.link.recv(GRAD, timeout=self.cfg.recv_timeout_s))
        if coded.step != step:
            raise RuntimeError(f"expected a gradient of step {step}, got one of {coded.step}")
        # the gradient of exactly the valid positions sent: another shape is refused
        # before it is built; the padding's gradient is zero (T masks it)
        shape = (int(lengths.sum()), width)
        # only the wire bytes cross to the side's device; it widens them there
        packed = self.grad_decoder.decode(coded, shape, math.prod(shape), self.side.device)
        return unpack_valid(packed, lengths, positions)

    # -- the compute thread

    def _forward(self, k: int, micro: int) -> None:
        index = self.side.indices(k, micro)
        h, src_len = self.side.forward(self.side.data[index], k)  # (B, S, C)
        n_chunks = min(self.cfg.activation_chunks, len(index))
        positions = h.shape[1]
        batch = Batch(Kind.TRAIN, k, micro, index, src_len.cpu(), n_chunks, positions)
        self.sender.put((batch, h.detach()))
        self.grads.put((k, tuple(h.shape), src_len.cpu()))
        self.pending.append((k, micro, h))

    def _backward(self, grad: torch.Tensor) -> None:
        """The oldest pending micro-batch's backward; a step's last one is followed by its
        update."""
        k, micro, h = self.pending.popleft()
        h.backward(grad.to(h.device))
        if micro == self.cfg.micro_batches - 1:
            self.side.step(k)

    def train_step(self, k: int) -> None:
        """Forwards while gradients are out, each backward as soon as its gradient lands;
        then the wait for what step k + 1's forwards need: update k under `sync`,
        update k - 1 under `stale1`."""
        micro = 0
        while micro < self.cfg.micro_batches:
            grad = self.grads.poll() if self.pending else None
            if grad is None:
                self._forward(k, micro)
                micro += 1
            else:
                self._backward(grad)
        self.settle(k - self.cfg.staleness)

    def settle(self, through: int) -> None:
        """Wait for the gradients of the steps up to `through`; their updates follow."""
        while self.pending and self.pending[0][0] <= through:
            self._backward(self.grads.get(timeout=self.cfg.recv_timeout_s))

    def read_syncs(self, through: int) -> None:
        """Read T's StepSyncs up to step `through`; each one's metrics go out as it is read."""
        while self.synced < through:
            sync = unpack_sync(expect_bytes(self.link.recv(SYNC, timeout=self.cfg.recv_timeout_s)))
            if not isinstance(sync, StepSync) or sync.step != self.synced + 1:
                raise RuntimeError(f"expected the sync of step {self.synced + 1}, got {sync}")
            self.synced = sync.step
            self.stop_asked |= sync.stop
            metrics = {
                "loss": sync.loss,
                "token_accuracy": sync.token_accuracy,
                "seconds": self.step_seconds.pop(sync.step),
                "bytes_to_decoder": float(self.sent.take(Kind.TRAIN, sync.step)),
                "bytes_to_decoder_total": float(self.sent.total),
                **self.choices.pop(sync.step, {}),
            }
            self.loop.report(sync.step, metrics)

    def evaluate(self, k: int) -> None:
        """Send the eval sources' encodings; T decodes them and answers with its BLEU."""
        assert self.eval_ids is not None
        n_eval = len(self.eval_ids)
        self.side.model.eval()
        with torch.no_grad():
            for lo in range(0, n_eval, self.cfg.eval_batch_size):
                index = torch.arange(lo, min(lo + self.cfg.eval_batch_size, n_eval))
                h, src_len = self.side.forward(self.eval_ids[index])
                n_chunks = min(self.cfg.activation_chunks, len(index))
                batch = Batch(Kind.EVAL, k, 0, index, src_len.cpu(), n_chunks, h.shape[1])
                self.sender.put((batch, h))
        self.side.model.train()
        self.sender.put(Control(Kind.EVAL_END, k))
        score = unpack_sync(expect_bytes(self.link.recv(SYNC, timeout=self.cfg.recv_timeout_s)))
        if not isinstance(score, EvalScore) or score.step != k:
            raise RuntimeError(f"expected the BLEU of step {k}, got {score}")
        self.loop.report_eval(k, {"bleu": score.bleu})

    def run(self) -> RoleResult:
        """Steps until the last, a stop asked for here, or one T asked for."""
        loop = self.loop
        mark = time.perf_counter()
        for k in loop.steps():
            self.train_step(k)
            evaluate = self.eval_ids is not None and loop.eval_due(k)
            if evaluate or loop.checkpoint_due(k):
                self.settle(k)  # under stale1 too, they see update k
            loop.finished(k, _encoder_state(self.side, k))
            now = time.perf_counter()
            self.step_seconds[k], mark = now - mark, now
            self.read_syncs(through=k - 1)  # the lag of one step: T's figures of step k - 1
            if self.stop_asked and k < loop.total:
                loop.peer_stopped()  # T asked to stop: this step was the last
                break
            if evaluate:
                self.read_syncs(through=k)
                self.evaluate(k)
        self.settle(loop.result.last_step)  # the artifact holds the last update
        self.sender.put(Control(Kind.STOP, loop.result.last_step))
        self.read_syncs(through=loop.result.last_step)
        self.sender.close()
        self.grads.close()
        return loop.result


def run_abnet_encoder(
    cfg: AbnetConfig,
    link: Link,
    source_lines: Sequence[str],
    source_plm: bytes,
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    eval_source_lines: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> RoleResult:
    """Scenario-II, cluster S: train the encoder adapters; only activations leave this cluster.

    `source_lines` are the source sides of the training pairs, in pair order;
    `eval_source_lines` those of the evaluation pairs (T computes the BLEU and
    reports it back). The result's `artifact` is `ckpt_dir / "adapters.safetensors"`.
    """
    loop = _loop(ENCODER, cfg, link, hooks, ckpt_dir)
    plm = load_pretrained(source_plm, device)
    side = EncoderSide(cfg, plm, check_lines(source_lines, "source"), seed, device)
    eval_ids = None
    if eval_source_lines is not None:
        eval_lines = check_lines(eval_source_lines, "source")
        eval_ids = encode_lines(plm.tokenizer, eval_lines, cfg.src_len)
    mine = {
        "config": asdict(cfg),
        "seed": seed,
        "n_train": len(side.data),
        "n_eval": len(eval_ids) if eval_ids is not None else 0,
        "d_model": side.d_model,
    }
    _hello(loop, mine, peer_role=DECODER)
    loop.resume(_restore(side))
    result = _Encoder(cfg, side, loop, eval_ids).run()
    if not result.stopped:
        result.artifact = save_adapters(side.model, loop.store, ENCODER, cfg)
    return result


# ---------------------------------------------------------------- the decoder role (cluster T)


class _Decoder:
    """T's loop: micro-batches as they are decoded, gradients out through the sending thread."""

    def __init__(
        self,
        cfg: AbnetConfig,
        side: DecoderSide,
        loop: RoleLoop,
        refs: list[str],
        d_model: int,
    ) -> None:
        self.cfg, self.side, self.loop, self.link = cfg, side, loop, loop.link
        self.refs, self.d_model = refs, d_model
        self.limits = {Kind.TRAIN: len(side.data), Kind.EVAL: len(refs)}
        self.decoders = {
            Kind.TRAIN: StreamDecoder(cfg, "forward", FORWARD),
            Kind.EVAL: StreamDecoder(cfg, "eval", FORWARD),
        }
        self.grad_encoder = StreamEncoder(cfg, "backward", BACKWARD, self.link.link_estimate)
        self.sent = ByteCount()
        self.choices: dict[int, dict[str, float]] = {}
        self.done = False
        self.inbox: Source[tuple[Batch, torch.Tensor] | Control] = Source(
            "abnet-decoder-recv", self._receive
        )
        self.sender: Stage[tuple[int, torch.Tensor] | StepSync | EvalScore, None] = Stage(
            "abnet-decoder-send", self._send
        )
        self.stats: list[DecoderStats] = []
        self.t0 = 0.0
        self.unreported: deque[tuple[int, dict[str, float]]] = deque()

    # -- the helper threads

    def _receive(self) -> tuple[Batch, torch.Tensor] | Control | None:
        """The next META, and the batch's activations decoded chunk by chunk as they land."""
        if self.done:
            return None
        timeout = self.cfg.recv_timeout_s
        meta = expect_bytes(self.link.recv(META, timeout=timeout))
        item = unpack_meta(meta, self.cfg.activation_chunks, self.cfg.src_len)
        if isinstance(item, Control):
            self.done = item.kind == Kind.STOP
            return item
        if len(item.index) > max(self.cfg.batch_size, self.cfg.eval_batch_size) or (
            len(item.index) and int(item.index.max()) >= self.limits[item.kind]
        ):
            raise ValueError(f"batch of step {item.step} names pairs this side does not hold")
        if len(item.src_len) and int(item.src_len.max()) > self.cfg.src_len:
            raise ValueError(f"source lengths of step {item.step} exceed {self.cfg.src_len}")
        decoder = self.decoders[item.kind]
        pieces = []
        for lengths in chunks(item.src_len, item.chunks):
            coded = unpack_coded(self.link.recv(ACT, timeout=timeout))
            if coded.step != item.step:
                raise RuntimeError(f"activations of step {coded.step} inside step {item.step}")
            # the valid positions only, as many rows as the lengths say (checked in
            # unpack_meta): any other shape is refused before it is built
            shape = (int(lengths.sum()), self.d_model)
            packed = decoder.decode(coded, shape, math.prod(shape), self.side.device)
            pieces.append(unpack_valid(packed, lengths, item.positions))
        return item, torch.cat(pieces)

    def _send(self, item: tuple[int, torch.Tensor] | StepSync | EvalScore) -> None:
        if isinstance(item, StepSync | EvalScore):
            self.link.send(SYNC, pack_sync(item))
            return
        step, grad = item
        payload = pack_coded(self.grad_encoder.encode(step, grad))
        self.link.send(GRAD, payload)
        self.sent.add(Kind.TRAIN, step, len(payload))
        self.choices[step] = auto_metrics("backward", self.grad_encoder)

    # -- the compute thread

    def train_micro(self, batch: Batch, memory: torch.Tensor) -> None:
        """One micro-batch: its gradient goes out at once; the last one ends the step."""
        cfg, loop = self.cfg, self.loop
        if batch.micro == 0:
            if batch.step != loop.next_step:
                raise RuntimeError(f"expected step {loop.next_step}, got {batch.step}")
            self.stats, self.t0 = [], time.perf_counter()
        elif (batch.step, batch.micro) != (loop.next_step, len(self.stats)):
            raise RuntimeError(f"out-of-order micro-batch {batch.micro} of step {batch.step}")
        grad, st = self.side.train_micro(batch.index, memory, batch.src_len)
        # S backpropagates it while this side goes on; only the valid positions cross
        self.sender.put((batch.step, pack_valid(grad, batch.src_len)))
        self.stats.append(st)
        if len(self.stats) < cfg.micro_batches:
            return
        k = batch.step
        self.side.step(k)
        m = step_metrics(self.stats)
        # a stop the caller asks for goes to S, which ends after its current step
        self.sender.put(StepSync(k, m["loss"], m["token_accuracy"], loop.stop_requested()))
        loop.finished(k, _state(self.side))
        tokens = sum(s.tokens for s in self.stats)
        m["tokens_per_s"] = tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.unreported.append((k, m))

    def report(self, item: tuple[Batch, torch.Tensor] | Control) -> None:
        """Metrics of finished steps once S has all their gradients (so their bytes are
        counted), which `item` shows: S sends a micro-batch of step j once it holds every
        gradient of step j - 1 (j - 2 under stale1), anything else once it holds them all."""
        through = math.inf
        if isinstance(item, tuple) and item[0].kind == Kind.TRAIN:
            through = item[0].step - 1 - self.cfg.staleness
        while self.unreported and self.unreported[0][0] <= through:
            k, m = self.unreported.popleft()
            m["bytes_to_encoder"] = float(self.sent.take(Kind.TRAIN, k))
            m["bytes_to_encoder_total"] = float(self.sent.total)
            m.update(self.choices.pop(k, {}))
            self.loop.report(k, m)

    def run(self) -> RoleResult:
        """Serve S until its `stop`."""
        hyps: list[str] = []
        while True:
            item = self.inbox.get(timeout=None)  # the receiving thread times out on the link
            self.report(item)
            if isinstance(item, Control):
                if item.kind == Kind.STOP:
                    break
                score = bleu(hyps, self.refs[: len(hyps)])
                hyps = []
                self.sender.put(EvalScore(item.step, score))
                self.loop.report_eval(item.step, {"bleu": score})
                continue
            batch, memory = item
            if batch.kind == Kind.EVAL:
                hyps += self.side.translate(memory, batch.src_len)
            else:
                self.train_micro(batch, memory)
        self.sender.close()
        self.inbox.join()
        return self.loop.served()


def run_abnet_decoder(
    cfg: AbnetConfig,
    link: Link,
    target_lines: Sequence[str],
    target_plm: bytes,
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    eval_target_lines: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> RoleResult:
    """Scenario-II, cluster T: train the decoder adapters; only gradients leave this cluster.

    `target_lines` are the target sides of the training pairs, in pair order;
    `eval_target_lines` the references BLEU is measured against (metric `bleu`,
    and `result.extra["bleu"]` after the last step). The result's `artifact`
    is `ckpt_dir / "adapters.safetensors"`.
    """
    loop = _loop(DECODER, cfg, link, hooks, ckpt_dir)
    plm = load_pretrained(target_plm, device)
    lines = check_lines(target_lines, "target")
    refs = check_lines(eval_target_lines, "target") if eval_target_lines is not None else []
    mine = {"config": asdict(cfg), "seed": seed, "n_train": len(lines), "n_eval": len(refs)}
    peer = _hello(loop, mine, peer_role=ENCODER)
    d_model = int(peer["d_model"])
    side = DecoderSide(cfg, plm, lines, d_model, seed, device)
    loop.resume(_restore(side))
    result = _Decoder(cfg, side, loop, refs, d_model).run()
    if not result.stopped:
        result.artifact = save_adapters(side.model, loop.store, DECODER, cfg)
    return result
