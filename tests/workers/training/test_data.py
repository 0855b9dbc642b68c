"""The demo corpus, tokenizers and the batch order."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from workers.training.data import (
    SPECIAL_TOKENS,
    batch_indices,
    encode_lines,
    lines_digest,
    train_tokenizer,
    tsv_side,
    write_demo_corpus,
)


def test_demo_corpus_is_deterministic_and_well_formed(tmp_path: Path) -> None:
    first = write_demo_corpus(tmp_path / "a")
    second = write_demo_corpus(tmp_path / "b")
    assert set(first) == {"text", "parallel.train", "parallel.valid", "parallel.test"}
    for key in first:
        assert first[key].read_bytes() == second[key].read_bytes(), key

    text = first["text"].read_text(encoding="utf-8").splitlines()
    assert 2000 < len(text) < 20000
    assert any(" tiene " in s for s in text) and any(" has " in s for s in text)  # both languages

    splits = {}
    for split in ("train", "valid", "test"):
        rows = first[f"parallel.{split}"].read_text(encoding="utf-8").splitlines()
        assert all(row.count("\t") == 1 for row in rows)
        splits[split] = set(rows)
    assert len(splits["train"]) == 3000 and len(splits["test"]) == 200
    assert not splits["train"] & splits["test"]
    assert not splits["train"] & splits["valid"]
    # numbers are spelled out in each language
    assert any(
        "veinti" in r.split("\t")[0] and "twenty" in r.split("\t")[1] for r in splits["train"]
    )


def test_tokenizer_keeps_case_and_accents(tmp_path: Path) -> None:
    files = write_demo_corpus(tmp_path)
    lines = files["text"].read_text(encoding="utf-8").splitlines()
    tok = train_tokenizer(lines[:2000], vocab_size=1000)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    ids = encode_lines(tok, ["María compró árboles.", "x " * 100], max_len=16)
    assert ids.shape == (2, 16)
    assert ids[0, 0] == 2 and 3 in ids[0].tolist() and ids[0, -1] == 0  # [CLS] ... [SEP] [PAD]
    assert ids[1, -1] == 3  # truncated, still closed by [SEP]
    text = tok.decode(ids[0].tolist(), skip_special_tokens=True)
    assert "María" in text and "árboles" in text


def test_a_line_of_rare_words_leaves_none_of_them_in_the_vocabulary(tmp_path: Path) -> None:
    files = write_demo_corpus(tmp_path)
    lines = files["text"].read_text(encoding="utf-8").splitlines()[:600]
    secret = "Zarvokian Quillemet 4815162342 Brontavisk"
    text = " ".join(lines)
    unique = [w for w in secret.split() if w not in text]
    assert len(unique) == 4

    def learnt(tok: Tokenizer) -> set[str]:
        """Vocabulary pieces of three characters or more that occur only in the secret line."""
        pieces = {t.removeprefix("##") for t in tok.get_vocab()}
        return {p for p in pieces if len(p) >= 3 and p in secret and p not in text}

    leaky = train_tokenizer([*lines, secret], vocab_size=2048, min_frequency=1)
    assert set(unique) <= set(leaky.get_vocab())  # what the default now prevents
    tok = train_tokenizer([*lines, secret], vocab_size=2048)
    assert not set(unique) & set(tok.get_vocab()) and learnt(tok) == set()
    # still usable: words seen often are whole pieces, and nothing becomes [UNK]
    words = text.split()
    common = {w for w in set(words) if words.count(w) >= 10 and w.isalpha()}
    assert len(common) > 20 and common <= set(tok.get_vocab())
    unk = tok.token_to_id(SPECIAL_TOKENS[1])
    assert all(unk not in e.ids for e in tok.encode_batch([*lines, secret]))


def test_batch_order_is_a_pure_function_and_covers_each_epoch() -> None:
    n, b = 50, 8
    per_epoch = [batch_indices(n, b, p, seed=3) for p in range(n // b)]
    flat = torch.cat(per_epoch)
    assert len(set(flat.tolist())) == len(flat)  # no repeats inside an epoch
    assert torch.equal(batch_indices(n, b, 2, seed=3), per_epoch[2])
    assert not torch.equal(batch_indices(n, b, 6, seed=3), per_epoch[0])  # next epoch reshuffles


def test_tsv_sides_and_digests() -> None:
    rows = ["hola\thello\n", "gato\tcat\n"]
    assert tsv_side(rows, 0) == ["hola", "gato"]
    assert tsv_side(rows, 1) == ["hello", "cat"]
    assert lines_digest(["a", "b"]) != lines_digest(["ab"])
