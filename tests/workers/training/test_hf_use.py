"""Imported Hugging Face models in the training roles: ABNet's frozen PLMs with their own
tokenizers and special ids.

Two random BERTs are built with `transformers` (different seeds, a WordPiece vocabulary of
the demo text laid out as BERT's is, with [CLS] and [SEP] away from Nebula's ids), and
ABNet runs split across a link with one as source and one as target model; the split run
equals the single-process reference, and the frozen weights stay as imported.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from workers.switch.link import Link
from workers.training.abnet import (
    AbnetConfig,
    run_abnet_decoder,
    run_abnet_encoder,
    train_abnet_local,
)
from workers.training.data import SPECIAL_TOKENS, SpecialIds, train_tokenizer
from workers.training.electra import load_pretrained

SEED = 5
LinkPairs = Callable[[str, str], tuple[Link, Link]]
RunRoles = Callable[..., Any]
Pairs = dict[str, tuple[list[str], list[str]]]


def bert_archive(lines: list[str], folder: Path, seed: int) -> bytes:
    """A random BertModel with a WordPiece vocabulary of `lines`, as a gzip tar of its folder."""
    nebula = train_tokenizer(lines, 600, 1)
    words = [
        t
        for t, _ in sorted(nebula.get_vocab().items(), key=lambda kv: kv[1])
        if t not in SPECIAL_TOKENS
    ]
    # BERT's layout: [PAD] first, then unused slots, then [UNK] [CLS] [SEP] [MASK]
    vocab = [
        "[PAD]",
        *[f"[unused{i}]" for i in range(5)],
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *words,
    ]
    folder.mkdir(parents=True)
    # vocab.txt with tokenizer_config.json, as BERT's own folders have them (transformers 5's
    # BertTokenizerFast no longer builds its vocabulary from a vocab_file)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    transformers.BertModel(config).save_pretrained(folder, safe_serialization=True)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return out.getvalue()


@pytest.fixture(scope="module")
def berts(pairs: Pairs, tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    root = tmp_path_factory.mktemp("berts")
    return (
        bert_archive(pairs["train"][0], root / "source-bert", seed=1),
        bert_archive(pairs["train"][1], root / "target-bert", seed=2),
    )


def test_imported_bert_brings_its_own_special_ids(berts: tuple[bytes, bytes]) -> None:
    plm = load_pretrained(berts[0])
    special = SpecialIds.of(plm.tokenizer)
    assert (special.pad, special.cls, special.sep, special.mask) == (0, 7, 8, 9)
    assert plm.config.post_ln and plm.config.type_vocab_size == 2
    assert plm.info["architecture"] == "BertModel"


def test_abnet_from_two_imported_berts_equals_the_reference(
    link_pairs: LinkPairs,
    run_roles: RunRoles,
    berts: tuple[bytes, bytes],
    pairs: Pairs,
    tmp_path: Path,
) -> None:
    source, target = berts
    cfg = AbnetConfig.tiny(
        steps=6,
        batch_size=8,
        micro_batches=2,
        adapter_dim=32,
        warmup_steps=2,
        ckpt_every=3,
        forward_codec="fp16",
        backward_codec="int8",
        eval_batch_size=8,
    )
    src, tgt = pairs["train"][0][:120], pairs["train"][1][:120]
    eval_src, eval_tgt = pairs["test"][0][:8], pairs["test"][1][:8]
    s_link, t_link = link_pairs("encoder", "decoder")
    out = run_roles(
        lambda: run_abnet_encoder(
            cfg, s_link, src, source, tmp_path / "s", None, eval_source_lines=eval_src, seed=SEED
        ),
        lambda: run_abnet_decoder(
            cfg, t_link, tgt, target, tmp_path / "t", None, eval_target_lines=eval_tgt, seed=SEED
        ),
    )
    s, t = out.a, out.b
    assert (s.last_step, t.last_step) == (6, 6)
    ref = train_abnet_local(
        cfg,
        source,
        target,
        src,
        tgt,
        eval_source_lines=eval_src,
        eval_target_lines=eval_tgt,
        seed=SEED,
    )
    for step, (r, h) in enumerate(zip(ref.history, t.history, strict=True), 1):
        for key in ("loss", "token_loss", "length_loss", "token_accuracy"):
            assert abs(r[key] - h[key]) <= 1e-5, (step, key)
            assert torch.isfinite(torch.tensor(h[key]))
    assert ref.bleu == pytest.approx(t.extra["bleu"], abs=1e-4)
    # the imported weights stayed frozen; only adapters and heads trained
    pristine = load_pretrained(target).body.state_dict()
    for name, tensor in ref.decoder.model.plm.state_dict().items():
        assert torch.equal(tensor, pristine[name]), name
    assert all(not p.requires_grad for p in ref.encoder.model.plm.parameters())
