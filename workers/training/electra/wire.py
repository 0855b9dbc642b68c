"""What crosses the link between ELECTRA's two roles: channels, batch messages, the sync.

The two models share no embeddings, so only token indices cross, packed in the
narrowest unsigned integer type:

- `shared` mode (the default, `discriminator_reads_text`: D's cluster reads
  the same text, as its owner or through a grant; the roles compare SHA-256
  digests of their lines at hello): the example indices and only the replaced
  positions with their sampled ids; D rebuilds the rest from its own copy of
  the text;
- `full` mode (D's cluster is not given the text): the whole corrupted
  sequence and a bit per position saying whether it was replaced.

Neither mode hides the text from D's cluster. In `shared` mode it holds the
text itself; in `full` mode it receives every sequence with about 85% of its
tokens unchanged, and the tokenizer (at hello) to decode them, so it can read
the text nearly verbatim. What `full` mode spares is a copy of the dataset at
rest on D's cluster, not its contents.

G -> D on BATCH: one message per micro-batch (`encode_batch`), or `STOP_MESSAGE`
when G's caller stops the job. D -> G on SYNC: a `StepSync` after each optimizer
step (step, RTD loss, RTD accuracy, stop).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from workers.training.electra.model import CorruptedBatch
from workers.training.messages import pack_message, pack_uint, unpack_int

BATCH, SYNC, HELLO = "electra.batch", "electra.sync", "electra.hello"
STOP_MESSAGE = pack_message({"kind": "stop"})  # on BATCH: G was asked to stop


def encode_batch(
    mode: str,
    step: int,
    micro: int,
    index: torch.Tensor,
    original: torch.Tensor,
    batch: CorruptedBatch,
    vocab_size: int,
    n_examples: int,
) -> bytes:
    """The bytes G sends for one micro-batch (see the module docstring for the two modes)."""
    header = {"kind": "batch", "mode": mode, "step": step, "micro": micro}
    B, T = batch.ids.shape
    if mode == "full":
        header["shape"] = [B, T]
        bits = np.packbits(batch.replaced.cpu().numpy().reshape(-1))
        return pack_message(header, {"ids": pack_uint(batch.ids, vocab_size - 1), "replaced": bits})
    flat = batch.replaced.reshape(-1).nonzero().squeeze(1)  # positions in B*T, ascending
    arrays = {
        "index": pack_uint(index, n_examples - 1),
        "pos": pack_uint(flat, B * T - 1),
        "tok": pack_uint(batch.ids.reshape(-1)[flat], vocab_size - 1),
    }
    del original  # D rebuilds it from its own copy of the text
    return pack_message(header, arrays)


def decode_batch(
    header: dict[str, Any], arrays: dict[str, np.ndarray], text_ids: torch.Tensor | None
) -> CorruptedBatch:
    """What D rebuilds from one message; `text_ids` is its own (N, T) text in shared mode."""
    if header["mode"] == "full":
        B, T = header["shape"]
        ids = unpack_int(arrays["ids"]).reshape(B, T)
        bits = np.unpackbits(arrays["replaced"], count=B * T).astype(bool)
        return CorruptedBatch(ids, torch.from_numpy(bits).reshape(B, T))
    if text_ids is None:
        raise ValueError("shared-mode batch but this discriminator holds no text")
    original = text_ids[unpack_int(arrays["index"])]  # (B, T)
    corrupted = original.clone()
    corrupted.view(-1)[unpack_int(arrays["pos"])] = unpack_int(arrays["tok"])
    return CorruptedBatch(corrupted, corrupted != original)
