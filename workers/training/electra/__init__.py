"""Scenario-I: ELECTRA pre-training with the generator and the discriminator on two clusters.

The generator G (a small masked-language model) corrupts the text; the
discriminator D (a larger model) learns to tell which tokens were replaced.
Only token ids cross from G to D, and a small `StepSync` back.

- `config.py`    `ElectraConfig` and its presets (`tiny`, `paper`).
- `model.py`     the generator and the discriminator, `CorruptedBatch` (what D trains on).
- `sides.py`     each model with its optimizer and random streams, one step of each
                 (`GeneratorSide`, `DiscriminatorSide`), the job's tokenizer.
- `wire.py`      what crosses between the two roles (channels, batch messages).
- `roles.py`     `run_electra_generator` (cluster G), `run_electra_discriminator` (cluster D).
- `replicas.py`  the discriminator's data-parallel replicas (torch.distributed).
- `local.py`     `train_electra_local`: the single-process reference of a split run.
- `artifact.py`  `export_pretrained` / `load_pretrained`: the `model` artifact.
"""

from workers.training.electra.artifact import PretrainedModel, export_pretrained, load_pretrained
from workers.training.electra.config import ElectraConfig, electra_preset
from workers.training.electra.local import LocalElectraRun, train_electra_local
from workers.training.electra.model import (
    CorruptedBatch,
    Discriminator,
    Generator,
    parameter_counts,
)
from workers.training.electra.roles import run_electra_discriminator, run_electra_generator
from workers.training.electra.sides import DiscriminatorSide, GeneratorSide, job_tokenizer
from workers.training.electra.wire import decode_batch, encode_batch

__all__ = [
    "CorruptedBatch",
    "Discriminator",
    "DiscriminatorSide",
    "ElectraConfig",
    "Generator",
    "GeneratorSide",
    "LocalElectraRun",
    "PretrainedModel",
    "decode_batch",
    "electra_preset",
    "encode_batch",
    "export_pretrained",
    "job_tokenizer",
    "load_pretrained",
    "parameter_counts",
    "run_electra_discriminator",
    "run_electra_generator",
    "train_electra_local",
]
