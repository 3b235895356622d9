"""HF transformers ALBERT checkpoints ↔ albert_jax parameters.

Pure NumPy: reading and writing `model.safetensors` needs neither torch nor
transformers. Kernels are transposed from torch's [out, in] layout, and the
attention projections are reshaped to [hidden, heads, head_dim] so tensor
parallelism can split heads. HF keeps one module per (group, inner layer);
albert_jax keeps stacks with a leading copy axis, copy = group·inner_num + i.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from albert_jax.model_config import ModelConfig

Params = dict[str, Any]

# config.json key → ModelConfig field.
_CONFIG_KEYS = (
    "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
    "num_attention_heads", "intermediate_size", "num_hidden_groups",
    "inner_group_num", "hidden_act", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "classifier_dropout_prob",
    "max_position_embeddings", "type_vocab_size", "initializer_range",
    "layer_norm_eps")

_LAYER_PREFIX = "encoder.albert_layer_groups.{g}.albert_layers.{i}."


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
  """ModelConfig from an HF ALBERT `config.json` dict."""
  if hf.get("model_type") != "albert":
    raise ValueError(
        f"config.json has model_type={hf.get('model_type')!r}; this loader "
        "reads ALBERT checkpoints (model_type 'albert').")
  values = {k: hf[k] for k in _CONFIG_KEYS if k in hf}
  if hf.get("classifier_dropout_prob") is None:
    values.pop("classifier_dropout_prob", None)
  labels = hf.get("id2label")
  if labels:
    values["num_sentence_labels"] = len(labels)
  return ModelConfig(share="all", embedding_projection=True, **values)


def config_to_hf(cfg: ModelConfig, architecture: str) -> dict[str, Any]:
  """HF `config.json` dict for `cfg`."""
  if cfg.share != "all" or not cfg.embedding_projection:
    raise ValueError(
        f"HF's ALBERT shares every layer and always projects E→H; a model "
        f"with share={cfg.share!r}, embedding_projection="
        f"{cfg.embedding_projection} has no AlbertModel equivalent.")
  out = {k: getattr(cfg, k) for k in _CONFIG_KEYS}
  out.update(model_type="albert", architectures=[architecture],
             pad_token_id=0, bos_token_id=2, eos_token_id=3,
             tie_word_embeddings=True,
             id2label={str(i): f"LABEL_{i}"
                       for i in range(cfg.num_sentence_labels)},
             label2id={f"LABEL_{i}": i
                       for i in range(cfg.num_sentence_labels)})
  return out


def _dense_in(w, b, heads=None):
  """torch Linear [out, in] → kernel [in, out] (or [in, heads, head_dim])."""
  k = np.asarray(w).T
  b = np.asarray(b)
  if heads is not None:
    k = k.reshape(k.shape[0], heads, -1)
    b = b.reshape(heads, -1)
  return {"kernel": k, "bias": b}


def _dense_out(p, heads_in=False):
  """Inverse of `_dense_in`: kernel → torch weight [out, in], flat bias."""
  k = np.asarray(p["kernel"])
  if heads_in:  # [heads, head_dim, out]
    k = k.reshape(-1, k.shape[-1])
  else:  # [in, out] or [in, heads, head_dim]
    k = k.reshape(k.shape[0], -1)
  return np.ascontiguousarray(k.T), np.asarray(p["bias"]).reshape(-1)


def _ln_in(w, b):
  return {"scale": np.asarray(w), "bias": np.asarray(b)}


def detect_parts(state: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """Which parts a state dict holds: key prefix, pooler, heads."""
  prefix = "albert." if any(k.startswith("albert.") for k in state) else ""
  return {
      "prefix": prefix,
      "pooler": f"{prefix}pooler.weight" in state,
      "mlm": "predictions.dense.weight" in state,
      "sop": "sop_classifier.classifier.weight" in state,
  }


def params_from_hf(state: Mapping[str, np.ndarray], cfg: ModelConfig
                   ) -> tuple[Params, dict[str, Any]]:
  """Converts an HF ALBERT state dict.

  Returns:
    (params, parts): params as the `Albert` module lays them out, and
    `detect_parts(state)`. Raises KeyError naming any missing tensor.
  """
  parts = detect_parts(state)
  p = parts["prefix"]
  used = set()

  def get(key):
    if key not in state:
      raise KeyError(f"checkpoint lacks tensor {key!r}")
    used.add(key)
    return np.asarray(state[key])

  def dense(key, heads=None):
    return _dense_in(get(key + ".weight"), get(key + ".bias"), heads)

  def ln(key):
    return _ln_in(get(key + ".weight"), get(key + ".bias"))

  heads = cfg.num_attention_heads
  params: Params = {
      "embeddings": {
          "word_embeddings": {"embedding": get(
              f"{p}embeddings.word_embeddings.weight")},
          "position_embeddings": {"embedding": get(
              f"{p}embeddings.position_embeddings.weight")},
          "token_type_embeddings": {"embedding": get(
              f"{p}embeddings.token_type_embeddings.weight")},
          "layer_norm": ln(f"{p}embeddings.LayerNorm"),
      },
  }
  attention, ffn = [], []
  for g in range(cfg.num_hidden_groups):
    for i in range(cfg.inner_group_num):
      a = p + _LAYER_PREFIX.format(g=g, i=i)
      out_k, out_b = get(a + "attention.dense.weight"), get(
          a + "attention.dense.bias")
      attention.append({
          "query": dense(a + "attention.query", heads),
          "key": dense(a + "attention.key", heads),
          "value": dense(a + "attention.value", heads),
          "output": {"kernel": out_k.T.reshape(heads, -1, out_k.shape[0]),
                     "bias": out_b},
          "layer_norm": ln(a + "attention.LayerNorm"),
      })
      ffn.append({
          "intermediate": dense(a + "ffn"),
          "output": dense(a + "ffn_output"),
          "layer_norm": ln(a + "full_layer_layer_norm"),
      })
  stack = lambda items: _stack(items)  # noqa: E731
  params["encoder"] = {
      "embedding_hidden_mapping_in": dense(
          f"{p}encoder.embedding_hidden_mapping_in"),
      "attention": stack(attention),
      "ffn": stack(ffn),
  }
  if parts["pooler"]:
    params["pooler"] = dense(f"{p}pooler")
  if parts["mlm"]:
    params["mlm"] = {
        "transform": dense("predictions.dense"),
        "layer_norm": ln("predictions.LayerNorm"),
        "output_bias": get("predictions.bias"),
    }
    _check_tied(state, "predictions.decoder.weight",
                params["embeddings"]["word_embeddings"]["embedding"], used)
    _check_tied(state, "predictions.decoder.bias",
                params["mlm"]["output_bias"], used)
  if parts["sop"]:
    params["sop"] = dense("sop_classifier.classifier")
  ignorable = ("position_ids", "token_type_ids")
  unused = sorted(k for k in state if k not in used
                  and not k.endswith(ignorable))
  if unused:
    raise ValueError(
        "Checkpoint tensors with no place in the model (is the config's "
        f"num_hidden_groups/inner_group_num right?): {unused[:8]}"
        + (f" and {len(unused) - 8} more" if len(unused) > 8 else ""))
  return params, parts


def _check_tied(state, key, expected, used):
  """Older checkpoints store the tied decoder explicitly; it must match."""
  if key in state:
    used.add(key)
    if not np.array_equal(np.asarray(state[key]), expected):
      raise ValueError(
          f"{key} differs from the tensor it is tied to; albert_jax ties the "
          "MLM decoder to the word embeddings and the decoder bias to "
          "predictions.bias, so an untied checkpoint cannot be loaded.")


def _stack(items: list[Params]) -> Params:
  if isinstance(items[0], dict):
    return {k: _stack([it[k] for it in items]) for k in items[0]}
  return np.stack(items)


def params_to_hf(params: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Inverse of `params_from_hf`, with the `albert.` prefix of the
  pre-training and masked-LM classes (tied tensors omitted, as HF saves)."""
  if cfg.share != "all":
    raise ValueError("Only share='all' models map onto HF's AlbertModel.")
  p = "albert."
  out: dict[str, np.ndarray] = {}

  def put_dense(key, d, heads_in=False):
    out[key + ".weight"], out[key + ".bias"] = _dense_out(d, heads_in)

  def put_ln(key, d):
    out[key + ".weight"] = np.asarray(d["scale"])
    out[key + ".bias"] = np.asarray(d["bias"])

  emb = params["embeddings"]
  for name in ("word_embeddings", "position_embeddings",
               "token_type_embeddings"):
    out[f"{p}embeddings.{name}.weight"] = np.asarray(emb[name]["embedding"])
  put_ln(f"{p}embeddings.LayerNorm", emb["layer_norm"])
  enc = params["encoder"]
  put_dense(f"{p}encoder.embedding_hidden_mapping_in",
            enc["embedding_hidden_mapping_in"])
  for g in range(cfg.num_hidden_groups):
    for i in range(cfg.inner_group_num):
      c = g * cfg.inner_group_num + i
      att = {k: _take(v, c) for k, v in enc["attention"].items()}
      ffn = {k: _take(v, c) for k, v in enc["ffn"].items()}
      a = p + _LAYER_PREFIX.format(g=g, i=i)
      for name in ("query", "key", "value"):
        put_dense(a + f"attention.{name}", att[name])
      put_dense(a + "attention.dense", att["output"], heads_in=True)
      put_ln(a + "attention.LayerNorm", att["layer_norm"])
      put_dense(a + "ffn", ffn["intermediate"])
      put_dense(a + "ffn_output", ffn["output"])
      put_ln(a + "full_layer_layer_norm", ffn["layer_norm"])
  if "pooler" in params:
    put_dense(f"{p}pooler", params["pooler"])
  if "mlm" in params:
    put_dense("predictions.dense", params["mlm"]["transform"])
    put_ln("predictions.LayerNorm", params["mlm"]["layer_norm"])
    out["predictions.bias"] = np.asarray(params["mlm"]["output_bias"])
  if "sop" in params:
    put_dense("sop_classifier.classifier", params["sop"])
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _take(tree, index):
  if isinstance(tree, dict):
    return {k: _take(v, index) for k, v in tree.items()}
  return np.asarray(tree)[index]


def architecture_for(parts: Mapping[str, bool]) -> str:
  if parts.get("mlm") and parts.get("sop"):
    return "AlbertForPreTraining"
  if parts.get("mlm"):
    return "AlbertForMaskedLM"
  return "AlbertModel"


def read_config(path: str) -> dict[str, Any]:
  with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}/config.json is not valid JSON: {e}") from e
