"""The `model` artifact of an ELECTRA job: the trained discriminator with its tokenizer.

One safetensors file: the discriminator's weights, and in its metadata the
transformer config, the tokenizer's JSON and free-form info. ABNet loads it as
its pretrained language model; the control plane checks the same metadata when
a `model` dataset is uploaded (app/workspaces/formats.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from tokenizers import Tokenizer

from contract.model_limits import check_bert_config
from workers.training.bert import BertConfig
from workers.training.electra_model import Discriminator, Generator
from workers.training.runtime import read_safetensors_metadata


@dataclass
class PretrainedModel:
    """A trained discriminator with its tokenizer: what a `model` dataset holds."""

    config: BertConfig
    tokenizer: Tokenizer
    discriminator: Discriminator
    info: dict[str, Any] = field(default_factory=dict)


def export_pretrained(
    model: Discriminator | Generator, tokenizer: Tokenizer, info: dict[str, Any] | None = None
) -> bytes:
    """One safetensors file: weights, plus config and tokenizer JSON in its metadata.

    A discriminator (ABNet's pretrained model) or a generator (an ELECTRA job's other half);
    both export to Hugging Face when trained `post_ln` (app/workspaces/hf_export.py).
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
    """Load what `export_pretrained` wrote (a `model` dataset's bytes)."""
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
