"""The `model` artifact of an ELECTRA job: the trained discriminator with its tokenizer.

One safetensors file: the discriminator's weights, and in its metadata the
transformer config, the tokenizer's JSON and free-form info. ABNet loads it as
its pretrained language model; the control plane checks the same metadata when
a `model` dataset is uploaded (app/datasets/formats.py). A `model` dataset may also
be a tar of a Hugging Face folder (BERT, ELECTRA, RoBERTa): `load_pretrained` reads
either (workers/training/hf_weights.py), with the model's own tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from tokenizers import Tokenizer
from torch import nn

from contract.model_limits import check_bert_config

# The module, not its names: hf_weights imports this package's model.py, and when it is
# imported first, its names are not defined yet while this package's __init__ runs.
from workers.training import hf_weights
from workers.training.bert import BertConfig, Encoder
from workers.training.checkpoints import read_safetensors_metadata
from workers.training.electra.model import Discriminator, Generator


@dataclass
class PretrainedModel:
    """A trained model with its tokenizer: what a `model` dataset holds.

    `discriminator` is Nebula's ELECTRA discriminator, or an imported checkpoint's module
    (a bare `Encoder`, a masked-LM `Generator` or a `Discriminator`); `body` is its encoder.
    """

    config: BertConfig
    tokenizer: Tokenizer
    discriminator: nn.Module
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def body(self) -> Encoder:
        """The transformer body, whatever head sits on it."""
        module = self.discriminator
        body = module if isinstance(module, Encoder) else module.body
        assert isinstance(body, Encoder)
        return body


def export_pretrained(
    model: Discriminator | Generator, tokenizer: Tokenizer, info: dict[str, Any] | None = None
) -> bytes:
    """One safetensors file: weights, plus config and tokenizer JSON in its metadata.

    A discriminator (ABNet's pretrained model) or a generator (an ELECTRA job's other half);
    both export to Hugging Face when trained `post_ln` (app/datasets/hf_export.py).
    """
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    kind = "generator" if isinstance(model, Generator) else "discriminator"
    metadata = {
        "nebula.kind": "model",
        "nebula.architecture": f"electra-{kind}",
        "nebula.format": "1",
        "config": json.dumps(asdict(model.cfg)),
        "tokenizer": tokenizer.to_str(),
        "info": json.dumps(info or {}),
    }
    return bytes(save_safetensors_bytes(tensors, metadata=metadata))


def load_pretrained(blob: bytes, device: str = "cpu") -> PretrainedModel:
    """Load a `model` dataset's bytes: what `export_pretrained` wrote, or an imported
    Hugging Face folder (a tar)."""
    if hf_weights.is_archive(blob):
        imported = hf_weights.load_hf_archive(blob, device)
        info = {"architecture": imported.config.architecture, "format": "huggingface"}
        return PretrainedModel(imported.body, imported.tokenizer, imported.model, info)
    meta = read_safetensors_metadata(blob)
    if meta.get("nebula.architecture") != "electra-discriminator":
        raise ValueError("not a Nebula ELECTRA discriminator model file")
    # checked before anything is built: the config is the file's claim, not its weights
    cfg = BertConfig(**check_bert_config(json.loads(meta["config"])))
    model = Discriminator(cfg)
    model.load_state_dict(load_safetensors_bytes(blob))
    return PretrainedModel(
        config=cfg,
        tokenizer=Tokenizer.from_str(meta["tokenizer"]),
        discriminator=model.to(device),
        info=json.loads(meta.get("info", "{}")),
    )
