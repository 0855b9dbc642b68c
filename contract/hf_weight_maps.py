"""One weight-name map per Hugging Face architecture: Nebula's parameter name -> saved names.

The fused key/value projection of Nebula's attention (`attn.kv`) is two saved tensors,
key then value, concatenated along the output dimension. Pure data: a worker loads
checkpoints with it (workers/training/hf_weights.py) and the control plane writes
Hugging Face folders with it, without torch (app/datasets/hf_export.py).
"""

from __future__ import annotations

from contract.hf_layout import HfConfig

WeightMap = dict[str, tuple[str, ...]]


def body_map(cfg: HfConfig, prefix: str = "body.") -> WeightMap:
    """Nebula's post-LN encoder (`workers.training.bert.Encoder`) from a BERT-style body."""
    names: WeightMap = {
        f"{prefix}embed.tok.weight": ("embeddings.word_embeddings.weight",),
        f"{prefix}embed.pos.weight": ("embeddings.position_embeddings.weight",),
        f"{prefix}embed.segment.weight": ("embeddings.token_type_embeddings.weight",),
        f"{prefix}embed.ln.weight": ("embeddings.LayerNorm.weight",),
        f"{prefix}embed.ln.bias": ("embeddings.LayerNorm.bias",),
    }
    if cfg.embedding_size != cfg.hidden_size:
        names[f"{prefix}embed.project.weight"] = ("embeddings_project.weight",)
        names[f"{prefix}embed.project.bias"] = ("embeddings_project.bias",)
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"encoder.layer.{i}.", f"{prefix}blocks.{i}."
        for kind in ("weight", "bias"):
            names[f"{ours}attn.q.{kind}"] = (f"{hf}attention.self.query.{kind}",)
            names[f"{ours}attn.kv.{kind}"] = (
                f"{hf}attention.self.key.{kind}",
                f"{hf}attention.self.value.{kind}",
            )
            names[f"{ours}attn.out.{kind}"] = (f"{hf}attention.output.dense.{kind}",)
            names[f"{ours}ln1.{kind}"] = (f"{hf}attention.output.LayerNorm.{kind}",)
            names[f"{ours}ff_in.{kind}"] = (f"{hf}intermediate.dense.{kind}",)
            names[f"{ours}ff_out.{kind}"] = (f"{hf}output.dense.{kind}",)
            names[f"{ours}ln2.{kind}"] = (f"{hf}output.LayerNorm.{kind}",)
    return names


def _mlm_head(dense: str, norm: str, bias: str) -> WeightMap:
    """Nebula's `Generator` head: dense, GELU, layer norm, tied output embedding + bias."""
    return {
        "dense.weight": (f"{dense}.weight",),
        "dense.bias": (f"{dense}.bias",),
        "ln.weight": (f"{norm}.weight",),
        "ln.bias": (f"{norm}.bias",),
        "bias": (bias,),
    }


BERT_MLM = _mlm_head(
    "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"
)
ELECTRA_MLM = _mlm_head(
    "generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias"
)
ROBERTA_MLM = _mlm_head("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
ELECTRA_DISCRIMINATOR: WeightMap = {
    "dense.weight": ("discriminator_predictions.dense.weight",),
    "dense.bias": ("discriminator_predictions.dense.bias",),
    "out.weight": ("discriminator_predictions.dense_prediction.weight",),
    "out.bias": ("discriminator_predictions.dense_prediction.bias",),
}
# architecture -> the head's map (None: a bare body, loaded as an `Encoder`)
ARCHITECTURE_MAPS: dict[str, WeightMap | None] = {
    "BertModel": None,
    "BertForMaskedLM": BERT_MLM,
    "BertForPreTraining": BERT_MLM,
    "ElectraModel": None,
    "ElectraForPreTraining": ELECTRA_DISCRIMINATOR,
    "ElectraForMaskedLM": ELECTRA_MLM,
    "RobertaModel": None,
    "RobertaForMaskedLM": ROBERTA_MLM,
    "XLMRobertaModel": None,
    "XLMRobertaForMaskedLM": ROBERTA_MLM,
}


def weight_map(cfg: HfConfig) -> WeightMap:
    """Nebula name -> saved names (body without its prefix) for `cfg`'s architecture."""
    head = ARCHITECTURE_MAPS[cfg.architecture]
    if head is None:
        return body_map(cfg, prefix="")
    return {**body_map(cfg), **head}
