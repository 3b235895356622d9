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

# transformers' `AlbertConfig` defaults (the xxlarge shape), used for keys a
# config.json leaves out; ModelConfig's own defaults are BERT-base-like.
_HF_DEFAULTS = {
    "vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096,
    "num_hidden_layers": 12, "num_attention_heads": 64,
    "intermediate_size": 16384, "num_hidden_groups": 1, "inner_group_num": 1,
    "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0, "classifier_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12,
}

_LAYER_PREFIX = "encoder.albert_layer_groups.{g}.albert_layers.{i}."

# Non-parameter buffers some checkpoints store; they carry no weights.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# Tied copies HF may store explicitly; checked against what they are tied to.
_TIED = ("predictions.decoder.weight", "predictions.decoder.bias")


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
  """ModelConfig from an HF ALBERT `config.json` dict.

  Raises:
    ValueError: the config is not an ALBERT one, or uses a variant (relative
      position embeddings) that albert_jax does not implement.
  """
  model_type = hf.get("model_type")
  if model_type is None and any(
      str(a).startswith("Albert") for a in hf.get("architectures") or ()):
    model_type = "albert"  # Configs from before `model_type` existed.
  if model_type != "albert":
    raise ValueError(
        f"config.json has model_type={model_type!r}; this loader reads "
        "ALBERT checkpoints (model_type 'albert').")
  position = hf.get("position_embedding_type") or "absolute"
  if position != "absolute":
    raise ValueError(
        f"config.json has position_embedding_type={position!r}; albert_jax "
        "implements only absolute position embeddings.")
  values = {k: hf.get(k, _HF_DEFAULTS[k]) for k in _CONFIG_KEYS}
  if values["classifier_dropout_prob"] is None:
    values["classifier_dropout_prob"] = _HF_DEFAULTS["classifier_dropout_prob"]
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
             dtype=cfg.param_dtype, pad_token_id=0, bos_token_id=2,
             eos_token_id=3,
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


def detect_parts(state: Mapping[str, Any]) -> dict[str, Any]:
  """Which parts a state dict holds: key prefix, pooler, heads."""
  prefix = "albert." if any(k.startswith("albert.") for k in state) else ""
  return {
      "prefix": prefix,
      "pooler": f"{prefix}pooler.weight" in state,
      "mlm": "predictions.dense.weight" in state,
      "sop": "sop_classifier.classifier.weight" in state,
  }


def expected_shapes(cfg: ModelConfig, parts: Mapping[str, Any]
                    ) -> dict[str, tuple[int, ...]]:
  """HF tensor name → shape that `cfg` implies, for the parts in `parts`.

  Tied copies (`predictions.decoder.*`) and buffers are not listed: HF's
  `save_pretrained` omits the former and the latter hold no weights.
  """
  p = parts["prefix"]
  v, e, h, f = (cfg.vocab_size, cfg.embedding_size, cfg.hidden_size,
                cfg.intermediate_size)
  shapes: dict[str, tuple[int, ...]] = {}

  def dense(key, n_out, n_in):
    shapes[key + ".weight"] = (n_out, n_in)
    shapes[key + ".bias"] = (n_out,)

  def ln(key, n):
    shapes[key + ".weight"] = shapes[key + ".bias"] = (n,)

  shapes[f"{p}embeddings.word_embeddings.weight"] = (v, e)
  shapes[f"{p}embeddings.position_embeddings.weight"] = (
      cfg.max_position_embeddings, e)
  shapes[f"{p}embeddings.token_type_embeddings.weight"] = (
      cfg.type_vocab_size, e)
  ln(f"{p}embeddings.LayerNorm", e)
  dense(f"{p}encoder.embedding_hidden_mapping_in", h, e)
  for g in range(cfg.num_hidden_groups):
    for i in range(cfg.inner_group_num):
      a = p + _LAYER_PREFIX.format(g=g, i=i)
      for name in ("query", "key", "value", "dense"):
        dense(a + f"attention.{name}", h, h)
      ln(a + "attention.LayerNorm", h)
      dense(a + "ffn", f, h)
      dense(a + "ffn_output", h, f)
      ln(a + "full_layer_layer_norm", h)
  if parts["pooler"]:
    dense(f"{p}pooler", h, h)
  if parts["mlm"]:
    dense("predictions.dense", e, h)
    ln("predictions.LayerNorm", e)
    shapes["predictions.bias"] = (v,)
  if parts["sop"]:
    dense("sop_classifier.classifier", cfg.num_sentence_labels, h)
  return shapes


def _config_summary(cfg: ModelConfig) -> str:
  return ", ".join(f"{k}={getattr(cfg, k)}" for k in (
      "vocab_size", "embedding_size", "hidden_size", "num_attention_heads",
      "intermediate_size", "num_hidden_groups", "inner_group_num",
      "max_position_embeddings", "type_vocab_size", "num_sentence_labels"))


def check_state_shapes(state: Mapping[str, Any], cfg: ModelConfig,
                       parts: Mapping[str, Any]) -> None:
  """Raises ValueError listing every tensor that does not fit `cfg`.

  Each line names the HF tensor and both shapes: missing tensors, tensors the
  config has no place for (e.g. a group beyond `num_hidden_groups`), and
  tensors of the wrong shape.
  """
  want = expected_shapes(cfg, parts)
  problems = []
  # In model order (embeddings, projection, layers, heads), then extras.
  for key in [*want, *sorted(k for k in state if k not in want)]:
    if key in want and key not in state:
      problems.append(f"  {key}: missing (config expects {want[key]})")
    elif key not in want:
      if key.endswith(_BUFFERS) or key in _TIED:
        continue
      problems.append(f"  {key}: unexpected {tuple(np.shape(state[key]))} "
                      "(config has no place for it)")
    elif tuple(np.shape(state[key])) != want[key]:
      problems.append(f"  {key}: checkpoint {tuple(np.shape(state[key]))}, "
                      f"config expects {want[key]}")
  if problems:
    shown = problems[:40]
    if len(problems) > 40:
      shown.append(f"  ... and {len(problems) - 40} more")
    raise ValueError(
        "the weights do not fit config.json ("
        f"{_config_summary(cfg)}); mismatched tensors:\n" + "\n".join(shown))


def params_from_hf(state: Mapping[str, np.ndarray], cfg: ModelConfig
                   ) -> tuple[Params, dict[str, Any]]:
  """Converts an HF ALBERT state dict.

  Args:
    state: HF tensor name → array, as `save_pretrained` writes them (with or
      without the `albert.` prefix; tied decoder copies and buffers allowed).
    cfg: the config the weights are meant for.

  Returns:
    (params, parts): params as the `Albert` module lays them out (attention
    kernels [H, heads, head_dim], output kernel [heads, head_dim, H], every
    layer stack with a leading copy axis), and `detect_parts(state)`.

  Raises:
    ValueError: a tensor is missing, unexpected or of the wrong shape (all
      are listed), or a stored tied copy differs from its source.
  """
  parts = detect_parts(state)
  check_state_shapes(state, cfg, parts)
  p = parts["prefix"]

  def get(key):
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
  params["encoder"] = {
      "embedding_hidden_mapping_in": dense(
          f"{p}encoder.embedding_hidden_mapping_in"),
      "attention": _stack(attention),
      "ffn": _stack(ffn),
  }
  if parts["pooler"]:
    params["pooler"] = dense(f"{p}pooler")
  if parts["mlm"]:
    params["mlm"] = {
        "transform": dense("predictions.dense"),
        "layer_norm": ln("predictions.LayerNorm"),
        "output_bias": get("predictions.bias"),
    }
  for key, source in zip(_TIED, (
      params["embeddings"]["word_embeddings"]["embedding"],
      params.get("mlm", {}).get("output_bias"))):
    _check_tied(state, key, source)
  if parts["sop"]:
    params["sop"] = dense("sop_classifier.classifier")
  return params, parts


def _check_tied(state, key, expected):
  """Older checkpoints store the tied decoder explicitly; it must match."""
  if key in state:
    if expected is None or not np.array_equal(np.asarray(state[key]),
                                              expected):
      raise ValueError(
          f"{key} differs from the tensor it is tied to; albert_jax ties the "
          "MLM decoder to the word embeddings and the decoder bias to "
          "predictions.bias, so an untied checkpoint cannot be loaded.")


def _stack(items: list[Params]) -> Params:
  if isinstance(items[0], dict):
    return {k: _stack([it[k] for it in items]) for k in items[0]}
  return np.stack(items)


def params_to_hf(params: Params, cfg: ModelConfig, prefix: str = "albert."
                 ) -> dict[str, np.ndarray]:
  """Inverse of `params_from_hf`.

  Args:
    params: an `Albert` parameter tree (unboxed).
    cfg: its config; must be share="all" with the E→H projection.
    prefix: "albert." for the pre-training and masked-LM classes, "" for a
      bare `AlbertModel`.

  Returns:
    HF tensor name → contiguous array in the parameters' dtype, tied tensors
    omitted, as `save_pretrained` writes them.
  """
  if cfg.share != "all" or not cfg.embedding_projection:
    raise ValueError("Only share='all' models with the E→H projection map "
                     "onto HF's AlbertModel.")
  p = prefix
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
  """The HF class whose `save_pretrained` writes these parts."""
  if parts.get("mlm") and parts.get("sop"):
    return "AlbertForPreTraining"
  if parts.get("mlm"):
    return "AlbertForMaskedLM"
  return "AlbertModel"


def read_config(path: str) -> dict[str, Any]:
  """The parsed `config.json` of checkpoint directory `path`."""
  file = os.path.join(path, "config.json")
  with open(file, encoding="utf-8") as f:
    try:
      config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{file} is not valid JSON: {e}") from e
  if not isinstance(config, dict):
    raise ValueError(f"{file} holds a {type(config).__name__}, not a JSON "
                     "object of config fields.")
  return config
