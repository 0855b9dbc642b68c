"""Scenario-II: ABNet translation fine-tuning split across a source and a target cluster.

ABNet (Guo et al. 2020, "Incorporating BERT into Parallel Sequence Decoding
with Adapters") keeps two pre-trained models frozen and trains only adapters. The
last encoder layer's activations go S -> T through the forward codec, their
gradients T -> S through the backward codec (spec strings of workers/compression,
`fp16` and `int8` by default as in Nebula-I, `none` until `compress_from_step`,
`auto` to let the link's measurement choose).

- `config.py`    `AbnetConfig`, the `tiny` and `paper` presets, the codec rules.
- `model.py`     the adapters and the two adapted PLMs (no training loop).
- `sides.py`     each side's model, optimizer and data: training steps, mask-predict, BLEU.
- `stale.py`     `schedule: stale1`: the encoder's forwards on its weights of one update
                 earlier (PipeDream-2BW), so a step's forwards need not wait for the last
                 gradient of the one before.
- `wire.py`      what crosses, as named types; the codec streams (`auto` resolved there).
- `roles.py`     `run_abnet_encoder` (cluster S), `run_abnet_decoder` (cluster T), their
                 codecs on sending and receiving threads (workers/training/pipeline.py).
- `local.py`     `train_abnet_local`: the single-process reference of a split run.
- `artifact.py`  the `adapters` artifact format.
"""

from workers.training.abnet.config import (
    AUTO,
    AUTO_CANDIDATES,
    AbnetConfig,
    abnet_preset,
)
from workers.training.abnet.local import LocalAbnetRun, train_abnet_local
from workers.training.abnet.roles import run_abnet_decoder, run_abnet_encoder
from workers.training.abnet.sides import bleu, decode_text
from workers.training.abnet.wire import (
    ACT,
    GRAD,
    HELLO,
    META,
    SYNC,
    EvalScore,
    StepSync,
)

__all__ = [
    "ACT",
    "AUTO",
    "AUTO_CANDIDATES",
    "GRAD",
    "HELLO",
    "META",
    "SYNC",
    "AbnetConfig",
    "EvalScore",
    "LocalAbnetRun",
    "StepSync",
    "abnet_preset",
    "bleu",
    "decode_text",
    "run_abnet_decoder",
    "run_abnet_encoder",
    "train_abnet_local",
]
