"""HF BERT, RoBERTa and ELECTRA tensor names ↔ albert_jax parameters.

The three share BERT's encoder, `encoder.layer.{l}.{attention.self.*,
attention.output.*, intermediate.dense, output.*}`, one module per layer,
which is copy l of albert_jax's unshared (share="none") stacks. They differ
in their key prefix, their heads and, for ELECTRA, the E→H
`embeddings_project` (albert_jax's `embedding_hidden_mapping_in`):

  BERT     pooler.dense; cls.predictions.{transform.dense, transform.LayerNorm,
           bias} (MLM), cls.seq_relationship (NSP, albert_jax's "sop").
  RoBERTa  pooler.dense; lm_head.{dense, layer_norm, bias} (MLM).
  ELECTRA  no pooler; generator_predictions.{dense, LayerNorm} and
           generator_lm_head.bias (MLM); discriminator_predictions.{dense,
           dense_prediction} (replaced-token detection, "rtd").

Every MLM decoder is tied to the word embeddings.
"""

from __future__ import annotations

from typing import Any, Mapping

from albert_jax.interop.tensor_map import Entry
from albert_jax.interop.tensor_map import Table
from albert_jax.model.config import ModelConfig

# Per family: the sign of each head in a state dict, where each head's
# tensors live, and the tied copies HF may store (→ the tensor tied to).
_HEADS = {
    "bert": {
        "mlm": "cls.predictions.transform.dense.weight",
        "sop": "cls.seq_relationship.weight",
    },
    "roberta": {"mlm": "lm_head.dense.weight"},
    "electra": {
        "mlm": "generator_predictions.dense.weight",
        "rtd": "discriminator_predictions.dense.weight",
    },
}
_TIED = {
    "bert": {"cls.predictions.decoder.weight":
             "{p}embeddings.word_embeddings.weight",
             "cls.predictions.decoder.bias": "cls.predictions.bias"},
    "roberta": {"lm_head.decoder.weight":
                "{p}embeddings.word_embeddings.weight",
                "lm_head.decoder.bias": "lm_head.bias"},
    "electra": {"generator_lm_head.weight":
                "{p}embeddings.word_embeddings.weight"},
}
# Per family: the heads a class holds → the class; a bare model's tensors
# have no prefix.
_ARCHITECTURES = {
    "bert": {("mlm", "sop"): "BertForPreTraining", ("mlm",): "BertForMaskedLM",
             ("sop",): "BertForNextSentencePrediction", (): "BertModel"},
    "roberta": {("mlm",): "RobertaForMaskedLM", (): "RobertaModel"},
    "electra": {("rtd",): "ElectraForPreTraining",
                ("mlm",): "ElectraForMaskedLM", (): "ElectraModel"},
}


def prefix(model_type: str, architecture: str) -> str:
  base = {"bert": "BertModel", "roberta": "RobertaModel",
          "electra": "ElectraModel"}[model_type]
  return "" if architecture == base else f"{model_type}."


def detect_parts(state: Mapping[str, Any], model_type: str
                 ) -> dict[str, Any]:
  """Which parts a state dict holds: key prefix, pooler, heads."""
  p = f"{model_type}."
  p = p if any(k.startswith(p) for k in state) else ""
  heads = _HEADS[model_type]
  parts = {"prefix": p, "pooler": f"{p}pooler.dense.weight" in state}
  for head in ("mlm", "sop", "rtd"):
    parts[head] = head in heads and heads[head] in state
  return parts


def tied(parts: Mapping[str, Any], model_type: str) -> dict[str, str]:
  return {k: v.format(p=parts["prefix"])
          for k, v in _TIED[model_type].items()}


def entries(cfg: ModelConfig, parts: Mapping[str, Any], model_type: str
            ) -> list[Entry]:
  """Every HF tensor `cfg` implies for `parts`, in model order."""
  p = parts["prefix"]
  v, e, h, f = (cfg.vocab_size, cfg.embedding_size, cfg.hidden_size,
                cfg.intermediate_size)
  t = Table()
  for name, rows in (("word_embeddings", v),
                     ("position_embeddings", cfg.max_position_embeddings),
                     ("token_type_embeddings", cfg.type_vocab_size)):
    t.add(f"{p}embeddings.{name}.weight", ("embeddings", name, "embedding"),
          (rows, e))
  t.layer_norm(f"{p}embeddings.LayerNorm", ("embeddings", "layer_norm"), e)
  if cfg.embedding_projection:
    t.dense(f"{p}embeddings_project",
            ("encoder", "embedding_hidden_mapping_in"), e, h)
  for layer in range(cfg.num_steps):
    a = f"{p}encoder.layer.{layer}."
    for name in ("query", "key", "value"):
      t.dense(a + f"attention.self.{name}", ("encoder", "attention", name),
              h, h, "heads_in", "heads_bias", copy=layer)
    t.dense(a + "attention.output.dense", ("encoder", "attention", "output"),
            h, h, "heads_out", copy=layer)
    t.layer_norm(a + "attention.output.LayerNorm",
                 ("encoder", "attention", "layer_norm"), h, copy=layer)
    t.dense(a + "intermediate.dense", ("encoder", "ffn", "intermediate"), h,
            f, copy=layer)
    t.dense(a + "output.dense", ("encoder", "ffn", "output"), f, h,
            copy=layer)
    t.layer_norm(a + "output.LayerNorm", ("encoder", "ffn", "layer_norm"), h,
                 copy=layer)
  if parts["pooler"]:
    t.dense(f"{p}pooler.dense", ("pooler",), h, h)
  if parts["mlm"]:
    head, norm, bias = {
        "bert": ("cls.predictions.transform.dense",
                 "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
        "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
        "electra": ("generator_predictions.dense",
                    "generator_predictions.LayerNorm",
                    "generator_lm_head.bias"),
    }[model_type]
    t.dense(head, ("mlm", "transform"), h, e)
    t.layer_norm(norm, ("mlm", "layer_norm"), e)
    t.add(bias, ("mlm", "output_bias"), (v,))
  if parts["sop"]:
    t.dense("cls.seq_relationship", ("sop",), h, cfg.num_sentence_labels)
  if parts["rtd"]:
    t.dense("discriminator_predictions.dense", ("rtd", "transform"), h, h)
    t.dense("discriminator_predictions.dense_prediction", ("rtd", "output"),
            h, 1)
  return t.entries


def architecture(parts: Mapping[str, bool], model_type: str) -> str:
  """The HF class whose `save_pretrained` writes these parts.

  Raises:
    ValueError: no HF class of the family holds this set of heads.
  """
  heads = tuple(h for h in ("mlm", "sop", "rtd") if parts.get(h))
  table = _ARCHITECTURES[model_type]
  if heads not in table:
    raise ValueError(
        f"No HF {model_type} class holds the heads {heads}; the family's "
        f"classes hold {sorted(table)}.")
  return table[heads]


def summary(cfg: ModelConfig) -> str:
  """The shape-defining fields, for error messages."""
  return ", ".join(f"{k}={getattr(cfg, k)}" for k in (
      "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
      "num_attention_heads", "intermediate_size", "max_position_embeddings",
      "type_vocab_size"))
