"""What a Hugging Face BERT, ELECTRA or (XLM-)RoBERTa checkpoint must hold, from its config.json.

Pure Python, shared by both sides: the control plane checks an uploaded folder's
safetensors headers against `expected_tensors` without torch (app/datasets/hf_archive.py),
and a worker maps the same names onto Nebula's body (workers/training/hf_weights.py).

The last part says what a tar of such a folder may hold, for both sides' readers.

Names are given without the base model's prefix (`bert.`, `electra.`, `roberta.`): a
`BertModel` saves `embeddings.word_embeddings.weight`, a `BertForMaskedLM`
`bert.embeddings.word_embeddings.weight`; `strip_prefix` makes them one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.model_limits import DEFAULT_LIMITS, ModelLimits, ModelTooLarge

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Architecture:
    """One `architectures` entry of config.json Nebula can import."""

    family: str  # "bert", "electra", "roberta" (XLM-RoBERTa has RoBERTa's layout)
    head: str  # "none", "mlm" (masked-LM logits) or "discriminator" (ELECTRA's RTD logit)


ARCHITECTURES: dict[str, Architecture] = {
    "BertModel": Architecture("bert", "none"),
    "BertForMaskedLM": Architecture("bert", "mlm"),
    "BertForPreTraining": Architecture("bert", "mlm"),  # its next-sentence head is dropped
    "ElectraModel": Architecture("electra", "none"),
    "ElectraForPreTraining": Architecture("electra", "discriminator"),
    "ElectraForMaskedLM": Architecture("electra", "mlm"),
    "RobertaModel": Architecture("roberta", "none"),
    "RobertaForMaskedLM": Architecture("roberta", "mlm"),
    "XLMRobertaModel": Architecture("roberta", "none"),
    "XLMRobertaForMaskedLM": Architecture("roberta", "mlm"),
}
MODEL_TYPES = {"bert": "bert", "electra": "electra", "roberta": "roberta", "xlm-roberta": "roberta"}
PREFIXES = {"bert": "bert.", "electra": "electra.", "roberta": "roberta."}
ACTIVATIONS = frozenset({"gelu"})  # BERT's, ELECTRA's and RoBERTa's (exact erf GELU)
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})


@dataclass(frozen=True)
class HfConfig:
    """The sizes Nebula needs from a config.json, checked."""

    architecture: str
    family: str
    head: str
    vocab_size: int
    hidden_size: int
    embedding_size: int  # ELECTRA may embed narrower than its hidden size, then project
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int
    dropout: float  # hidden_dropout_prob

    @property
    def position_pad_id(self) -> int:
        """RoBERTa counts positions from pad id + 1 over real tokens; -1: plain 0..T-1."""
        return self.pad_token_id if self.family == "roberta" else -1


def _positive_int(config: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = config.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelTooLarge(f"config.json: {name} must be a positive integer")
    return value


def parse_config(config: Any, limits: ModelLimits = DEFAULT_LIMITS) -> HfConfig:
    """The config.json of an importable model, within `limits`; ModelTooLarge naming what is
    wrong otherwise (an unknown architecture, a field out of range, too many weights)."""
    if not isinstance(config, dict):
        raise ModelTooLarge("config.json is not a JSON object")
    names = config.get("architectures")
    if not isinstance(names, list) or len(names) != 1 or not isinstance(names[0], str):
        raise ModelTooLarge("config.json must name exactly one entry in architectures")
    architecture = names[0]
    known = ARCHITECTURES.get(architecture)
    if known is None:
        raise ModelTooLarge(
            f"architecture {architecture[:80]!r} is not importable; known: "
            + ", ".join(sorted(ARCHITECTURES))
        )
    model_type = config.get("model_type")
    if MODEL_TYPES.get(model_type if isinstance(model_type, str) else "") != known.family:
        raise ModelTooLarge(f"config.json: model_type {model_type!r} contradicts {architecture}")
    act = config.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ModelTooLarge(f"config.json: hidden_act {str(act)[:40]!r} is not supported (gelu)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelTooLarge("config.json: only absolute position embeddings are supported")
    if config.get("tie_word_embeddings", True) is not True:
        raise ModelTooLarge("config.json: untied output embeddings are not supported")
    if config.get("is_decoder", False) or config.get("add_cross_attention", False):
        raise ModelTooLarge("config.json: decoder configurations are not supported")
    eps = config.get("layer_norm_eps", 1e-12)
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not 0 < eps < 1:
        raise ModelTooLarge("config.json: layer_norm_eps must be a number in (0, 1)")
    dropout = config.get("hidden_dropout_prob", 0.1)
    if not isinstance(dropout, int | float) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise ModelTooLarge("config.json: hidden_dropout_prob must be a number in [0, 1)")
    hidden = _positive_int(config, "hidden_size")
    heads = _positive_int(config, "num_attention_heads")
    pad = config.get("pad_token_id", 0)
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
        raise ModelTooLarge("config.json: pad_token_id must be a non-negative integer")
    parsed = HfConfig(
        architecture=architecture,
        family=known.family,
        head=known.head,
        vocab_size=_positive_int(config, "vocab_size"),
        hidden_size=hidden,
        embedding_size=(
            _positive_int(config, "embedding_size", hidden) if known.family == "electra" else hidden
        ),
        num_hidden_layers=_positive_int(config, "num_hidden_layers"),
        num_attention_heads=heads,
        intermediate_size=_positive_int(config, "intermediate_size"),
        max_position_embeddings=_positive_int(config, "max_position_embeddings"),
        type_vocab_size=_positive_int(config, "type_vocab_size", 2),
        layer_norm_eps=float(eps),
        pad_token_id=pad,
        dropout=float(dropout),
    )
    bounds = {
        "vocab_size": (parsed.vocab_size, limits.vocab_size),
        "hidden_size": (parsed.hidden_size, limits.d_model),
        "embedding_size": (parsed.embedding_size, limits.d_model),
        "num_hidden_layers": (parsed.num_hidden_layers, limits.n_layers),
        "num_attention_heads": (parsed.num_attention_heads, limits.n_heads),
        "intermediate_size": (parsed.intermediate_size, limits.d_ff),
        "max_position_embeddings": (parsed.max_position_embeddings, limits.max_len + 2),
        "type_vocab_size": (parsed.type_vocab_size, 16),
    }
    for name, (value, bound) in bounds.items():
        if value > bound:
            raise ModelTooLarge(f"config.json: {name} = {value} exceeds {bound}")
    if hidden % heads:
        raise ModelTooLarge("config.json: hidden_size is not a multiple of num_attention_heads")
    if parsed.family == "roberta" and parsed.pad_token_id + 1 >= parsed.max_position_embeddings:
        raise ModelTooLarge("config.json: pad_token_id leaves no positions")
    if parsed.pad_token_id >= parsed.vocab_size:
        raise ModelTooLarge("config.json: pad_token_id is outside the vocabulary")
    total = parameter_count(parsed)
    if total > limits.parameters:
        raise ModelTooLarge(
            f"config.json asks for {total:,} parameters, over the limit of {limits.parameters:,}"
        )
    return parsed


def body_tensors(cfg: HfConfig) -> dict[str, Shape]:
    """The encoder's tensors (no prefix) and their shapes."""
    V, H, E, F = cfg.vocab_size, cfg.hidden_size, cfg.embedding_size, cfg.intermediate_size
    shapes: dict[str, Shape] = {
        "embeddings.word_embeddings.weight": (V, E),
        "embeddings.position_embeddings.weight": (cfg.max_position_embeddings, E),
        "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, E),
        "embeddings.LayerNorm.weight": (E,),
        "embeddings.LayerNorm.bias": (E,),
    }
    if E != H:
        shapes["embeddings_project.weight"] = (H, E)
        shapes["embeddings_project.bias"] = (H,)
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            shapes[f"{p}attention.self.{name}.weight"] = (H, H)
            shapes[f"{p}attention.self.{name}.bias"] = (H,)
        shapes[f"{p}attention.output.dense.weight"] = (H, H)
        shapes[f"{p}attention.output.dense.bias"] = (H,)
        shapes[f"{p}attention.output.LayerNorm.weight"] = (H,)
        shapes[f"{p}attention.output.LayerNorm.bias"] = (H,)
        shapes[f"{p}intermediate.dense.weight"] = (F, H)
        shapes[f"{p}intermediate.dense.bias"] = (F,)
        shapes[f"{p}output.dense.weight"] = (H, F)
        shapes[f"{p}output.dense.bias"] = (H,)
        shapes[f"{p}output.LayerNorm.weight"] = (H,)
        shapes[f"{p}output.LayerNorm.bias"] = (H,)
    return shapes


def head_tensors(cfg: HfConfig) -> dict[str, Shape]:
    """The head's tensors Nebula uses (full names as saved, no body prefix to strip)."""
    V, H, E = cfg.vocab_size, cfg.hidden_size, cfg.embedding_size
    if cfg.head == "discriminator":
        return {
            "discriminator_predictions.dense.weight": (H, H),
            "discriminator_predictions.dense.bias": (H,),
            "discriminator_predictions.dense_prediction.weight": (1, H),
            "discriminator_predictions.dense_prediction.bias": (1,),
        }
    if cfg.head != "mlm":
        return {}
    if cfg.family == "electra":
        return {
            "generator_predictions.dense.weight": (E, H),
            "generator_predictions.dense.bias": (E,),
            "generator_predictions.LayerNorm.weight": (E,),
            "generator_predictions.LayerNorm.bias": (E,),
            "generator_lm_head.bias": (V,),
        }
    if cfg.family == "roberta":
        return {
            "lm_head.dense.weight": (H, H),
            "lm_head.dense.bias": (H,),
            "lm_head.layer_norm.weight": (H,),
            "lm_head.layer_norm.bias": (H,),
            "lm_head.bias": (V,),
        }
    return {
        "cls.predictions.transform.dense.weight": (H, H),
        "cls.predictions.transform.dense.bias": (H,),
        "cls.predictions.transform.LayerNorm.weight": (H,),
        "cls.predictions.transform.LayerNorm.bias": (H,),
        "cls.predictions.bias": (V,),
    }


def optional_tensors(cfg: HfConfig) -> dict[str, Shape]:
    """Tensors a checkpoint may hold that Nebula checks but does not use.

    Tied output embeddings (equal to the input embeddings, which Nebula ties), the pooler
    and BERT's next-sentence head, and the position-id buffers older versions saved.
    """
    V, H, E = cfg.vocab_size, cfg.hidden_size, cfg.embedding_size
    shapes: dict[str, Shape] = {
        "pooler.dense.weight": (H, H),
        "pooler.dense.bias": (H,),
        "embeddings.position_ids": (1, cfg.max_position_embeddings),
        "embeddings.token_type_ids": (1, cfg.max_position_embeddings),
    }
    if cfg.head == "mlm" and cfg.family == "electra":
        shapes["generator_lm_head.weight"] = (V, E)
    elif cfg.head == "mlm" and cfg.family == "roberta":
        shapes["lm_head.decoder.weight"] = (V, H)
        shapes["lm_head.decoder.bias"] = (V,)
    elif cfg.head == "mlm":
        shapes["cls.predictions.decoder.weight"] = (V, H)
        shapes["cls.predictions.decoder.bias"] = (V,)
        shapes["cls.seq_relationship.weight"] = (2, H)
        shapes["cls.seq_relationship.bias"] = (2,)
    return shapes


def strip_prefix(cfg: HfConfig, name: str) -> str:
    """A saved tensor's name without the base model's prefix."""
    return name.removeprefix(PREFIXES[cfg.family])


def parameter_count(cfg: HfConfig) -> int:
    """The weights the config asks for (body and the head Nebula uses), from shapes alone."""
    shapes = [*body_tensors(cfg).values(), *head_tensors(cfg).values()]
    return sum(math.prod(shape) for shape in shapes)


def check_tensors(cfg: HfConfig, found: Mapping[str, tuple[str, Shape]]) -> None:
    """Every tensor the config calls for is there with its shape, and nothing else is.

    `found` maps each saved name to (dtype, shape). ModelTooLarge names the first problem.
    """
    required = {**body_tensors(cfg), **head_tensors(cfg)}
    optional = optional_tensors(cfg)
    seen: set[str] = set()
    for saved, (dtype, shape) in found.items():
        name = saved if saved in required or saved in optional else strip_prefix(cfg, saved)
        if name in seen:
            raise ModelTooLarge(f"tensor {saved[:120]!r} appears twice (with and without prefix)")
        seen.add(name)
        expected = required.get(name, optional.get(name))
        if expected is None:
            raise ModelTooLarge(f"tensor {saved[:120]!r} is not part of a {cfg.architecture}")
        if tuple(shape) != expected:
            raise ModelTooLarge(
                f"tensor {saved[:120]!r} has shape {list(shape)}, config.json implies"
                f" {list(expected)}"
            )
        is_index = name.endswith(("position_ids", "token_type_ids"))
        if not is_index and dtype not in FLOAT_DTYPES:
            raise ModelTooLarge(f"tensor {saved[:120]!r} has dtype {dtype}, not a float")
    missing = sorted(set(required) - seen)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelTooLarge(f"tensor {missing[0]!r} is missing{more}")


# ------------------------------------------------------------- the folder in its archive
# Both sides read the same tar of one Hugging Face folder: the control plane as it streams
# in (app/datasets/hf_archive.py), a worker from memory before it builds a model
# (workers/training/hf_weights.py). What a member may be, which files hold the weights and
# which the tokenizer, is decided here once; LayoutError names what is wrong.

MAX_MEMBERS = 256  # a folder has ~10 files; a large model ~100 shards
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
OTHER_WEIGHT_SUFFIXES = (".h5", ".msgpack", ".onnx", ".gguf", ".keras")


class LayoutError(ValueError):
    """An archive that is not one Hugging Face folder Nebula imports."""


def archive_kind(head: bytes) -> str | None:
    """What the first 512 bytes of a `model` dataset start: a "gzip" or plain "tar" archive
    of a Hugging Face folder, or None (a Nebula safetensors file)."""
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[257:262] == b"ustar":
        return "tar"
    return None


def member_path(name: str) -> list[str]:
    """The parts of a member's path; LayoutError if it is absolute, leaves the folder or is odd."""
    shown = name[:120]
    if not name or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise LayoutError(f"member {shown!r} has an absolute path")
    if "\\" in name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise LayoutError(f"member {shown!r} has a backslash or a control character in its path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise LayoutError(f"member {shown!r} has '..' in its path")
    return parts


def file_member(name: str) -> tuple[str, str]:
    """(folder, basename) of a regular file's member, one folder deep at most; LayoutError
    otherwise."""
    parts = member_path(name)
    if len(parts) > 2:
        raise LayoutError(f"member {name[:120]!r} is in a nested folder")
    return ("/".join(parts[:-1]), parts[-1]) if parts else ("", "")


def refuse_unsafe_file(base: str) -> None:
    """LayoutError for a pickle (nothing is ever unpickled) or weights in another format."""
    lower = base.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        raise LayoutError(
            f"{base[:120]!r} is a pickle: only safetensors weights are accepted, and"
            " nothing is ever unpickled"
        )
    if lower.endswith(OTHER_WEIGHT_SUFFIXES):
        raise LayoutError(f"{base[:120]!r}: only safetensors weights are accepted")


def is_weights_file(base: str) -> bool:
    """model.safetensors, or one shard of it (model-00001-of-00002.safetensors)."""
    return base == SINGLE_WEIGHTS or _SHARD.fullmatch(base) is not None


def weights_layout(names: Iterable[str]) -> str:
    """Where the weights are: SINGLE_WEIGHTS, or WEIGHTS_INDEX for shards; LayoutError if
    both, shards without an index, or none."""
    present = set(names)
    shards = any(_SHARD.fullmatch(name) for name in present)
    if SINGLE_WEIGHTS in present:
        if shards or WEIGHTS_INDEX in present:
            raise LayoutError("both model.safetensors and sharded weights")
        return SINGLE_WEIGHTS
    if WEIGHTS_INDEX in present:
        return WEIGHTS_INDEX
    if shards:
        raise LayoutError("sharded weights without model.safetensors.index.json")
    raise LayoutError("model.safetensors is missing (only safetensors weights are accepted)")


def tokenizer_file(cfg: HfConfig, names: Iterable[str]) -> str:
    """The file the folder's tokenizer is read from: tokenizer.json, or (not for RoBERTa,
    whose BPE needs it) a WordPiece vocab.txt beside tokenizer_config.json."""
    present = set(names)
    if "tokenizer.json" in present:
        return "tokenizer.json"
    if cfg.family != "roberta" and {"vocab.txt", "tokenizer_config.json"} <= present:
        return "vocab.txt"
    raise LayoutError(
        "the tokenizer is missing: tokenizer.json"
        + (", or vocab.txt with tokenizer_config.json" if cfg.family != "roberta" else "")
    )
