"""HF transformers ALBERT tensor names ↔ albert_jax parameters.

HF keeps one module per (group, inner layer) under
`encoder.albert_layer_groups.{g}.albert_layers.{i}`; albert_jax keeps one
stack per component with copy = g · inner_group_num + i.
"""

from __future__ import annotations

from typing import Any, Mapping

from albert_jax.interop.tensor_map import Entry
from albert_jax.interop.tensor_map import Table
from albert_jax.model.config import ModelConfig

_LAYER = "encoder.albert_layer_groups.{g}.albert_layers.{i}."

# Tied copies HF may store explicitly → the tensor each is tied to.
_TIED = {"predictions.decoder.weight": "{p}embeddings.word_embeddings.weight",
         "predictions.decoder.bias": "predictions.bias"}


def prefix(architecture: str) -> str:
  """Key prefix of an architecture: a bare AlbertModel has none."""
  return "" if architecture == "AlbertModel" else "albert."


def detect_parts(state: Mapping[str, Any]) -> dict[str, Any]:
  """Which parts a state dict holds: key prefix, pooler, heads."""
  p = "albert." if any(k.startswith("albert.") for k in state) else ""
  return {
      "prefix": p,
      "pooler": f"{p}pooler.weight" in state,
      "mlm": "predictions.dense.weight" in state,
      "sop": "sop_classifier.classifier.weight" in state,
      "rtd": False,
  }


def tied(parts: Mapping[str, Any]) -> dict[str, str]:
  return {k: v.format(p=parts["prefix"]) for k, v in _TIED.items()}


def entries(cfg: ModelConfig, parts: Mapping[str, Any]) -> list[Entry]:
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
  t.dense(f"{p}encoder.embedding_hidden_mapping_in",
          ("encoder", "embedding_hidden_mapping_in"), e, h)
  for g in range(cfg.num_hidden_groups):
    for i in range(cfg.inner_group_num):
      a = p + _LAYER.format(g=g, i=i)
      c = g * cfg.inner_group_num + i
      for name in ("query", "key", "value"):
        t.dense(a + f"attention.{name}", ("encoder", "attention", name), h, h,
                "heads_in", "heads_bias", copy=c)
      t.dense(a + "attention.dense", ("encoder", "attention", "output"), h, h,
              "heads_out", copy=c)
      t.layer_norm(a + "attention.LayerNorm",
                   ("encoder", "attention", "layer_norm"), h, copy=c)
      t.dense(a + "ffn", ("encoder", "ffn", "intermediate"), h, f, copy=c)
      t.dense(a + "ffn_output", ("encoder", "ffn", "output"), f, h, copy=c)
      t.layer_norm(a + "full_layer_layer_norm",
                   ("encoder", "ffn", "layer_norm"), h, copy=c)
  if parts["pooler"]:
    t.dense(f"{p}pooler", ("pooler",), h, h)
  if parts["mlm"]:
    t.dense("predictions.dense", ("mlm", "transform"), h, e)
    t.layer_norm("predictions.LayerNorm", ("mlm", "layer_norm"), e)
    t.add("predictions.bias", ("mlm", "output_bias"), (v,))
  if parts["sop"]:
    t.dense("sop_classifier.classifier", ("sop",), h, cfg.num_sentence_labels)
  return t.entries


def architecture(parts: Mapping[str, bool]) -> str:
  """The HF class whose `save_pretrained` writes these parts."""
  if parts.get("mlm") and parts.get("sop"):
    return "AlbertForPreTraining"
  if parts.get("mlm"):
    return "AlbertForMaskedLM"
  return "AlbertModel"


def summary(cfg: ModelConfig) -> str:
  """The shape-defining fields, for error messages."""
  return ", ".join(f"{k}={getattr(cfg, k)}" for k in (
      "vocab_size", "embedding_size", "hidden_size", "num_attention_heads",
      "intermediate_size", "num_hidden_groups", "inner_group_num",
      "max_position_embeddings", "type_vocab_size", "num_sentence_labels"))
