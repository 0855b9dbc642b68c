"""Imported Hugging Face models in the training roles: ABNet's frozen PLMs with their own
tokenizers and special ids.

Two random BERTs are built with `transformers` (different seeds, a WordPiece vocabulary of
the demo text laid out as BERT's is, with [CLS] and [SEP] away from Nebula's ids), and
ABNet runs split across a link with one as source and one as target model; the split run
equals the single-process reference, and the frozen weights stay as imported.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from support.hf import save_random_model, tar_folder, wordpiece_vocab, write_wordpiece_files
from workers.switch.link import Link
from workers.training.abnet import (
    AbnetConfig,
    run_abnet_decoder,
    run_abnet_encoder,
    train_abnet_local,
)
from workers.training.data import SpecialIds
from workers.training.electra import load_pretrained

SEED = 5
LinkPairs = Callable[[str, str], tuple[Link, Link]]
RunRoles = Callable[..., Any]
Pairs = dict[str, tuple[list[str], list[str]]]


def bert_archive(lines: list[str], folder: Path, seed: int) -> bytes:
    """A random BertModel with a WordPiece vocabulary of `lines`, as a gzip tar of its folder."""
    vocab = wordpiece_vocab(lines)
    write_wordpiece_files(folder, vocab)
    save_random_model(
        folder,
        transformers.BertConfig,
        transformers.BertModel,
        seed=seed,
        vocab_size=len(vocab),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return tar_folder(folder)


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


def electra_pair(lines: list[str], root: Path) -> tuple[bytes, bytes]:
    """A random ElectraForMaskedLM (generator) and ElectraForPreTraining (discriminator)
    sharing one vocabulary, as google's pairs do; each a gzip tar of its folder."""
    vocab = wordpiece_vocab(lines)
    out = []
    for name, model_class, sizes in (
        (
            "generator",
            transformers.ElectraForMaskedLM,
            {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 1},
        ),
        (
            "discriminator",
            transformers.ElectraForPreTraining,
            {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2},
        ),
    ):
        folder = root / name
        write_wordpiece_files(folder, vocab)
        save_random_model(
            folder,
            transformers.ElectraConfig,
            model_class,
            seed=len(name),
            vocab_size=len(vocab),
            embedding_size=32,
            num_hidden_layers=2,
            max_position_embeddings=64,
            **sizes,
        )
        out.append(tar_folder(folder))
    return out[0], out[1]


def test_electra_continued_from_an_imported_pair_equals_the_reference(
    link_pairs: LinkPairs, run_roles: RunRoles, text_lines: list[str], tmp_path: Path
) -> None:
    from workers.training.electra import (
        DiscriminatorSide,
        ElectraConfig,
        load_pretrained,
        run_electra_discriminator,
        run_electra_generator,
        train_electra_local,
    )
    from workers.training.electra.roles import initial_model

    lines = text_lines[:300]
    generator, discriminator = electra_pair(lines, tmp_path / "pair")
    cfg = ElectraConfig.tiny(steps=4, batch_size=8, ckpt_every=2, warmup_steps=1)
    g_link, d_link = link_pairs("generator", "discriminator")
    out = run_roles(
        lambda: run_electra_generator(
            cfg, g_link, lines, tmp_path / "g", seed=SEED, init_model=generator
        ),
        lambda: run_electra_discriminator(
            cfg, d_link, None, tmp_path / "d", seed=SEED, init_model=discriminator
        ),
    )
    g, d = out.a, out.b
    assert (g.last_step, d.last_step) == (4, 4)
    g_init, tok = initial_model(generator, cfg, "init_generator")
    d_init, _ = initial_model(discriminator, cfg, "init_discriminator")
    # the imported sizes, not the preset's; the imported tokenizer, not one trained here
    assert g_init[0].d_model == 32 and d_init[0].d_model == 64
    start = DiscriminatorSide(
        cfg, tok.get_vocab_size(), SEED, "cpu", special=SpecialIds.of(tok), init=d_init
    )
    imported = load_pretrained(discriminator).discriminator.state_dict()
    assert start.model.state_dict().keys() == imported.keys()
    for name, tensor in start.model.state_dict().items():
        assert torch.equal(tensor, imported[name]), name
    ref = train_electra_local(
        cfg, lines, seed=SEED, tokenizer=tok, init_generator=g_init, init_discriminator=d_init
    )
    for step, (r, hg, hd) in enumerate(zip(ref.history, g.history, d.history, strict=True), 1):
        assert abs(r["mlm_loss"] - hg["mlm_loss"]) <= 1e-5, step
        assert abs(r["rtd_loss"] - hd["rtd_loss"]) <= 1e-5, step
    assert d.artifact is not None
    trained = load_pretrained(d.artifact.read_bytes())
    assert trained.tokenizer.get_vocab() == tok.get_vocab()  # the model's own, kept
    assert trained.config.post_ln and trained.config.d_embed == 32
