"""Data for the training roles: the demo corpus, WordPiece tokenizers, id tensors, batch order.

The platform opens datasets through its grant-checked reader and hands a role
plain lines of text; nothing here reads a dataset by itself except
`write_demo_corpus`, which creates one.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from num2words import num2words
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # ids 0..4 in every tokenizer trained here
# the same roles in RoBERTa's and XLM-R's vocabularies (imported models bring their own)
_ROLE_NAMES = {
    "pad": (PAD, "<pad>"),
    "cls": (CLS, "<s>"),
    "sep": (SEP, "</s>"),
    "mask": (MASK, "<mask>"),
}


@dataclass(frozen=True)
class SpecialIds:
    """Where a tokenizer keeps its special tokens: Nebula's at 0..4, an imported model's
    wherever its vocabulary has them ([CLS] at 101 in BERT's, <s> at 0 in RoBERTa's)."""

    pad: int
    cls: int
    sep: int
    mask: int
    special: tuple[int, ...]  # every special token's id: never masked, sampled or predicted

    @classmethod
    def of(cls, tok: Tokenizer) -> SpecialIds:
        """The special ids of `tok` (ValueError if it lacks one of the four roles)."""
        found: dict[str, int] = {}
        for role, names in _ROLE_NAMES.items():
            ids = [tok.token_to_id(name) for name in names]
            hit = next((i for i in ids if i is not None), None)
            if hit is None:
                raise ValueError(f"the tokenizer has no {' or '.join(names)} token")
            found[role] = hit
        added = tok.get_added_tokens_decoder()
        special = {i for i, token in added.items() if token.special}
        special |= {i for name in SPECIAL_TOKENS if (i := tok.token_to_id(name)) is not None}
        return cls(**found, special=tuple(sorted(special | set(found.values()))))

    def is_special(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool (like `ids`): True at special tokens."""
        table = torch.zeros(max(self.special) + 1, dtype=torch.bool, device=ids.device)
        table[list(self.special)] = True
        return table[ids.clamp(max=len(table) - 1)] & (ids < len(table))


# ---------------------------------------------------------------- demo corpus

# (es singular, es plural, en singular, en plural, es gender)
_NOUNS = [
    ("gato", "gatos", "cat", "cats", "m"),
    ("perro", "perros", "dog", "dogs", "m"),
    ("casa", "casas", "house", "houses", "f"),
    ("libro", "libros", "book", "books", "m"),
    ("manzana", "manzanas", "apple", "apples", "f"),
    ("coche", "coches", "car", "cars", "m"),
    ("mesa", "mesas", "table", "tables", "f"),
    ("silla", "sillas", "chair", "chairs", "f"),
    ("pájaro", "pájaros", "bird", "birds", "m"),
    ("flor", "flores", "flower", "flowers", "f"),
    ("árbol", "árboles", "tree", "trees", "m"),
    ("ventana", "ventanas", "window", "windows", "f"),
]
# (es masculine, es feminine, en)
_COLOURS = [
    ("rojo", "roja", "red"),
    ("blanco", "blanca", "white"),
    ("negro", "negra", "black"),
    ("verde", "verde", "green"),
    ("azul", "azul", "blue"),
    ("amarillo", "amarilla", "yellow"),
]
_NAMES = ["Ana", "Luis", "María", "Carlos", "Elena", "Pablo", "Lucía", "Jorge", "Sofía", "Diego"]
_CITIES = ["Madrid", "Lima", "Bogotá", "Quito", "Sevilla", "Valencia", "Toledo", "Cusco"]
_DAYS = [
    ("lunes", "Monday"),
    ("martes", "Tuesday"),
    ("miércoles", "Wednesday"),
    ("jueves", "Thursday"),
    ("viernes", "Friday"),
    ("sábado", "Saturday"),
    ("domingo", "Sunday"),
]
_PLACES = [("cocina", "kitchen"), ("escuela", "school"), ("calle", "street"), ("plaza", "square")]


def _es(n: int) -> str:
    return str(num2words(n, lang="es"))


def _en(n: int) -> str:
    return str(num2words(n, lang="en"))


# (Spanish, English) sentence templates; `_demo_pair` fills in their fields
_TEMPLATES = [
    ("{name} tiene {n_es} {es_pl}.", "{name} has {n_en} {en_pl}."),
    ("hay {n_es} {es_pl} en la {place_es}.", "there are {n_en} {en_pl} in the {place_en}."),
    ("el {day_es} compré {n_es} {es_pl}.", "on {day_en} i bought {n_en} {en_pl}."),
    ("{art} {es_sg} de {name} es {col_es}.", "{name}'s {en_sg} is {col_en}."),
    (
        "{name} vive en {city} desde hace {n_es} años.",
        "{name} has lived in {city} for {n_en} years.",
    ),
    ("{a_es} más {b_es} son {sum_es}.", "{a_en} plus {b_en} is {sum_en}."),
    (
        "mañana {name} va a comprar {n_es} {es_pl}.",
        "tomorrow {name} is going to buy {n_en} {en_pl}.",
    ),
    ("{name} le dio {n_es} {es_pl} a {other}.", "{name} gave {n_en} {en_pl} to {other}."),
    ("{art} {es_sg} {col_es} está en la {place_es}.", "the {col_en} {en_sg} is in the {place_en}."),
    (
        "el {day_es} {name} vio {n_es} {es_pl} en {city}.",
        "on {day_en} {name} saw {n_en} {en_pl} in {city}.",
    ),
]


def _demo_pair(rng: random.Random) -> tuple[str, str]:
    """One Spanish sentence and its English translation, from a random template."""
    es_sg, es_pl, en_sg, en_pl, gender = rng.choice(_NOUNS)
    col_m, col_f, col_en = rng.choice(_COLOURS)
    name = rng.choice(_NAMES)
    other = rng.choice([x for x in _NAMES if x != name])
    day_es, day_en = rng.choice(_DAYS)
    place_es, place_en = rng.choice(_PLACES)
    city = rng.choice(_CITIES)
    n = rng.randint(2, 199)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    es, en = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
    words = {
        "es_sg": es_sg,
        "es_pl": es_pl,
        "en_sg": en_sg,
        "en_pl": en_pl,
        "art": "el" if gender == "m" else "la",
        "col_es": col_m if gender == "m" else col_f,
        "col_en": col_en,
        "name": name,
        "other": other,
        "day_es": day_es,
        "day_en": day_en,
        "place_es": place_es,
        "place_en": place_en,
        "city": city,
        "n_es": _es(n),
        "n_en": _en(n),
        "a_es": _es(a),
        "a_en": _en(a),
        "b_es": _es(b),
        "b_en": _en(b),
        "sum_es": _es(a + b),
        "sum_en": _en(a + b),
    }
    return es.format_map(words), en.format_map(words)


def demo_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    """`count` distinct es-en pairs drawn from the templates (deterministic in `seed`)."""
    rng = random.Random(seed)
    seen: set[tuple[str, str]] = set()
    pairs: list[tuple[str, str]] = []
    while len(pairs) < count:
        pair = _demo_pair(rng)
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return pairs


def write_demo_corpus(out_dir: Path) -> dict[str, Path]:
    """Write Nebula's demo corpus: a mixed es/en `text` file and es-en TSV splits."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # one pool of distinct pairs, so no test pair is also a training pair
    pairs = demo_pairs(3400 + 1800, seed=20220531)
    train, valid, test, mono = pairs[:3000], pairs[3000:3200], pairs[3200:3400], pairs[3400:]
    # the monolingual text: the train pairs' two sides and more sentences, all unpaired
    text = [s for pair in train + mono for s in pair]
    random.Random(7).shuffle(text)
    files = {
        "text": out_dir / "text.txt",
        "parallel.train": out_dir / "parallel.train.tsv",
        "parallel.valid": out_dir / "parallel.valid.tsv",
        "parallel.test": out_dir / "parallel.test.tsv",
    }
    files["text"].write_text("".join(f"{s}\n" for s in text), encoding="utf-8")
    for split, rows in (("train", train), ("valid", valid), ("test", test)):
        lines = "".join(f"{es}\t{en}\n" for es, en in rows)
        files[f"parallel.{split}"].write_text(lines, encoding="utf-8")
    return files


def tsv_side(lines: Iterable[str], column: int) -> list[str]:
    """One column of `source<TAB>target` lines (0: source, 1: target)."""
    return [line.rstrip("\n").split("\t")[column] for line in lines if line.strip()]


def clean_lines(lines: Iterable[str]) -> list[str]:
    """Non-empty lines without their line breaks."""
    return [s for s in (line.rstrip("\r\n") for line in lines) if s.strip()]


def lines_digest(lines: Sequence[str]) -> str:
    """SHA-256 of the lines: two roles read the same text iff their digests match."""
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


# ---------------------------------------------------------------- tokenizer


MIN_TOKEN_FREQUENCY = 5


def train_tokenizer(
    lines: Sequence[str], vocab_size: int, min_frequency: int = MIN_TOKEN_FREQUENCY
) -> Tokenizer:
    """A WordPiece tokenizer trained on a job's own text (case and accents kept).

    Pieces seen fewer than `min_frequency` times are not learnt: the vocabulary travels
    with the trained model, and a rare word (a name, an ID number) on a single line
    must not come out of the text verbatim. Such words are spelt from smaller pieces,
    down to single characters, which are always kept.
    """
    if min_frequency < 1:
        raise ValueError("min_frequency must be at least 1")
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    # case and accents are kept: translations are scored on them
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        min_frequency=min_frequency,
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    return tok


NEBULA_SPECIAL = SpecialIds(pad=0, cls=2, sep=3, mask=4, special=(0, 1, 2, 3, 4))


def encode_lines(tok: Tokenizer, lines: Sequence[str], max_len: int) -> torch.Tensor:
    """Ids (N, max_len): [CLS] tokens [SEP], truncated, padded with [PAD] (or the
    tokenizer's own <s>, </s> and <pad>)."""
    special = SpecialIds.of(tok)
    cls, sep = special.cls, special.sep
    ids = torch.full((len(lines), max_len), special.pad, dtype=torch.long)
    for i, enc in enumerate(tok.encode_batch(list(lines), add_special_tokens=False)):
        row = [cls, *enc.ids[: max_len - 2], sep]
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids


def decode_ids(tok: Tokenizer, ids: Sequence[int]) -> str:
    """Text of token ids, special tokens dropped."""
    return str(tok.decode(list(ids), skip_special_tokens=True))


# ---------------------------------------------------------------- batch order


def batch_indices(n_examples: int, batch_size: int, position: int, seed: int) -> torch.Tensor:
    """Example indices of the `position`-th batch: a fresh permutation each epoch.

    A pure function of its arguments, so a resumed role and its peer agree on
    the data order without any saved state.
    """
    per_epoch = max(1, n_examples // batch_size)
    epoch, slot = divmod(position, per_epoch)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n_examples, generator=g)
    return perm[slot * batch_size : (slot + 1) * batch_size]
