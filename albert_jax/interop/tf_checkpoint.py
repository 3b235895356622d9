"""google-research/albert TF1 release directories → albert_jax parameters.

A release directory holds `albert_config.json`, a TF1 checkpoint
(`model.ckpt-*.index` and its `.data-*` shards) and the SentencePiece model
`30k-clean.model`. Variables are read with `tf.train.load_checkpoint`;
TensorFlow is imported only here, only when such a directory is loaded. A
`gs://` directory's checkpoint files are first copied into a local temporary
directory: TensorFlow reaches Cloud Storage only through its own filesystem
plugin and credentials, which `STORAGE_EMULATOR_HOST` does not steer.

The official variable names (TF kernels are [in, out], the attention
projections flat over heads):

  bert/embeddings/{word,position,token_type}_embeddings, LayerNorm/{gamma,beta}
  bert/encoder/embedding_hidden_mapping_in/{kernel,bias}  (only when E != H)
  bert/encoder/transformer/group_{g}/inner_group_{i}/
      attention_1/self/{query,key,value}/*, attention_1/output/dense/*,
      LayerNorm/*, ffn_1/intermediate/dense/*,
      ffn_1/intermediate/output/dense/*, LayerNorm_1/*
  bert/pooler/dense/*
  cls/predictions/{transform/dense/*, transform/LayerNorm/*, output_bias}
  cls/seq_relationship/{output_weights [2, H], output_bias}

Optimizer slots (`*/adam_m`, `*/adam_v` of the official AdamW and LAMB, and
tf.train.AdamOptimizer's `*/Adam`, `*/Adam_1`, `beta{1,2}_power`) and
`global_step` are skipped. Variables outside `bert/` and the two pre-training
heads (a fine-tuning classifier's `output_weights`, `cls/squad/*`) are left
out with a warning; anything unexpected inside them is an error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from typing import Any, Mapping

from albert_jax import storage
from albert_jax.interop import CheckpointError
from albert_jax.interop import child
from albert_jax.interop import tensor_map
from albert_jax.model.config import ModelConfig

log = logging.getLogger(__name__)

CONFIG_FILE = "albert_config.json"

# The official AlbertConfig's defaults (modeling.py); vocab_size has none.
_DEFAULTS = {
    "embedding_size": 128, "hidden_size": 4096, "num_hidden_layers": 12,
    "num_hidden_groups": 1, "num_attention_heads": 64,
    "intermediate_size": 16384, "inner_group_num": 1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02,
}
# Released configs carry these; the official modeling code never reads them.
_INERT = ("net_structure_type", "gap_size", "num_memory_blocks",
          "down_scale_factor", "layers_to_keep")
# The official get_activation names → ours: its "gelu" is the tanh form.
_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh"}
_SLOTS = ("adam_m", "adam_v", "Adam", "Adam_1")
_NON_WEIGHTS = ("global_step", "beta1_power", "beta2_power")
_MAPPED = ("bert/", "cls/predictions/", "cls/seq_relationship/")
_INSTALL = "install TensorFlow with `pip install 'albert_jax[tf]'`"


def is_release_dir(path: str) -> bool:
  return storage.path(child(path, CONFIG_FILE)).is_file()


def config_from_tf(values: Mapping[str, Any]) -> ModelConfig:
  """ModelConfig from an official `albert_config.json` dict.

  Raises:
    ValueError: an unknown key or activation, no vocab_size, or a layer
      count and group count the official code maps to groups differently
      from HF (and albert_jax).
  """
  known = ("vocab_size", *_DEFAULTS, *_INERT)
  unknown = sorted(k for k in values if k not in known)
  if unknown:
    raise ValueError(f"unknown keys {unknown}; the official AlbertConfig "
                     f"reads {sorted(k for k in known if k not in _INERT)}.")
  if "vocab_size" not in values:
    raise ValueError("vocab_size is missing; the official AlbertConfig "
                     "requires it.")
  fields = {k: values.get(k, default) for k, default in _DEFAULTS.items()}
  act = fields["hidden_act"]
  if act not in _ACTIVATIONS:
    raise ValueError(f"hidden_act={act!r}; albert_jax implements the "
                     f"official {sorted(_ACTIVATIONS)}.")
  fields["hidden_act"] = _ACTIVATIONS[act]
  cfg = ModelConfig(
      vocab_size=values["vocab_size"], share="all",
      embedding_projection=fields["embedding_size"] != fields["hidden_size"],
      layer_norm_eps=1e-12, **fields)
  layers, groups = cfg.num_hidden_layers, cfg.num_hidden_groups
  official = [int(l / layers * groups) for l in range(layers)]
  ours = [int(l / (layers / groups)) for l in range(layers)]
  if official != ours:
    raise ValueError(
        f"with num_hidden_layers={layers} and num_hidden_groups={groups} the "
        f"official code assigns layers to groups {official} (floating-point "
        f"rounding of l / L * G), HF and albert_jax {ours}; such a checkpoint "
        "cannot be reproduced.")
  return cfg


def find_checkpoint(path: str, step: int | None = None) -> str:
  """The checkpoint prefix to read in `path`.

  `model.ckpt-{step}` when `step` is given; otherwise the only checkpoint,
  else the releases' `model.ckpt-best`, else the highest-numbered one.
  """
  names = sorted(p.name[:-len(".index")] for p in storage.path(path).iterdir()
                 if p.name.endswith(".index"))
  prefixes = [child(path, n) for n in names]
  if not prefixes:
    raise CheckpointError(
        f"{path} has {CONFIG_FILE} but no TF checkpoint (model.ckpt-*.index "
        "with its .data-* files); the download is incomplete.")
  if step is not None:
    if f"model.ckpt-{step}" not in names:
      raise CheckpointError(f"{path} has no checkpoint model.ckpt-{step}; "
                            f"it holds {names}.")
    return child(path, f"model.ckpt-{step}")
  if len(prefixes) == 1:
    return prefixes[0]
  if "model.ckpt-best" in names:
    return child(path, "model.ckpt-best")
  numbered = {int(m.group(1)): p for n, p in zip(names, prefixes)
              if (m := re.fullmatch(r"model\.ckpt-(\d+)", n))}
  if not numbered:
    raise CheckpointError(f"{path} holds several checkpoints {names} and "
                          "none is model.ckpt-best or model.ckpt-N; keep one.")
  return numbered[max(numbered)]


def detect_parts(shapes: Mapping[str, Any]) -> dict[str, bool]:
  def has(start):
    return any(k.startswith(start) for k in shapes)
  return {"pooler": has("bert/pooler/"), "mlm": has("cls/predictions/"),
          "sop": has("cls/seq_relationship/"), "rtd": False}


def entries(cfg: ModelConfig, parts: Mapping[str, bool]
            ) -> list[tensor_map.Entry]:
  """Every official variable `cfg` implies for `parts`, in model order."""
  v, e, h, f = (cfg.vocab_size, cfg.embedding_size, cfg.hidden_size,
                cfg.intermediate_size)
  t = tensor_map.Table(weight="kernel", bias="bias", scale="gamma", shift="beta",
                   sep="/")
  for name, rows in (("word_embeddings", v),
                     ("token_type_embeddings", cfg.type_vocab_size),
                     ("position_embeddings", cfg.max_position_embeddings)):
    t.add(f"bert/embeddings/{name}", ("embeddings", name, "embedding"),
          (rows, e))
  t.layer_norm("bert/embeddings/LayerNorm", ("embeddings", "layer_norm"), e)
  if cfg.embedding_projection:
    t.dense("bert/encoder/embedding_hidden_mapping_in",
            ("encoder", "embedding_hidden_mapping_in"), e, h, "same")
  for g in range(cfg.num_hidden_groups):
    for i in range(cfg.inner_group_num):
      a = f"bert/encoder/transformer/group_{g}/inner_group_{i}/"
      c = g * cfg.inner_group_num + i
      for name in ("query", "key", "value"):
        t.dense(a + f"attention_1/self/{name}", ("encoder", "attention", name),
                h, h, "tf_heads_in", "heads_bias", copy=c)
      t.dense(a + "attention_1/output/dense",
              ("encoder", "attention", "output"), h, h, "tf_heads_out",
              copy=c)
      t.layer_norm(a + "LayerNorm", ("encoder", "attention", "layer_norm"), h,
                   copy=c)
      t.dense(a + "ffn_1/intermediate/dense",
              ("encoder", "ffn", "intermediate"), h, f, "same", copy=c)
      t.dense(a + "ffn_1/intermediate/output/dense",
              ("encoder", "ffn", "output"), f, h, "same", copy=c)
      t.layer_norm(a + "LayerNorm_1", ("encoder", "ffn", "layer_norm"), h,
                   copy=c)
  if parts["pooler"]:
    t.dense("bert/pooler/dense", ("pooler",), h, h, "same")
  if parts["mlm"]:
    t.dense("cls/predictions/transform/dense", ("mlm", "transform"), h, e,
            "same")
    t.layer_norm("cls/predictions/transform/LayerNorm", ("mlm", "layer_norm"),
                 e)
    t.add("cls/predictions/output_bias", ("mlm", "output_bias"), (v,))
  if parts["sop"]:
    # [labels, H], applied as x · Wᵀ: a torch-style layout.
    n = cfg.num_sentence_labels
    t.add("cls/seq_relationship/output_weights", ("sop", "kernel"), (n, h),
          "transpose")
    t.add("cls/seq_relationship/output_bias", ("sop", "bias"), (n,))
  return t.entries


def _skipped(name: str) -> bool:
  """Optimizer state and counters, which hold no weights."""
  return name in _NON_WEIGHTS or name.rsplit("/", 1)[-1] in _SLOTS


def _local_prefix(prefix: str, staging: str) -> str:
  """A local name for the checkpoint `prefix`: its own (with `~` expanded),
  or for a gs:// one, that of a copy of its .index and .data-* files in the
  directory `staging`."""
  source = storage.path(prefix)
  if not storage.is_remote(source):
    return os.fspath(source)
  for f in source.parent.iterdir():
    if f.name == f"{source.name}.index" or f.name.startswith(
        f"{source.name}.data-"):
      with f.open("rb") as src, open(os.path.join(staging, f.name),
                                     "wb") as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
  return os.path.join(staging, source.name)


def _reader(prefix: str, staging: str):
  """TensorFlow's reader of the checkpoint `prefix` (`_local_prefix`'s copy
  in `staging` for a gs:// one); errors name `prefix` as the user's path
  gives it."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise CheckpointError(
        f"{prefix} is a TensorFlow checkpoint and TensorFlow is not "
        f"installed; {_INSTALL}.") from e
  try:
    return tf.train.load_checkpoint(_local_prefix(prefix, staging))
  except (tf.errors.OpError, ValueError) as e:
    raise CheckpointError(
        f"TensorFlow cannot read the checkpoint {prefix} ({e}). Its .index "
        "or .data-* files are missing or corrupt: re-download it.") from e


def load(path: str, step: int | None, overrides: Mapping[str, Any]
         ) -> dict[str, Any]:
  """The fields of a `Pretrained` for release directory `path`."""
  config_file = child(path, CONFIG_FILE)
  try:
    values = json.loads(storage.path(config_file).read_bytes())
    if not isinstance(values, dict):
      raise ValueError(f"it holds a {type(values).__name__}, not a JSON "
                       "object")
    cfg = config_from_tf(values)
    if overrides:
      cfg = ModelConfig.from_dict({**cfg.to_dict(), **overrides})
  except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError,
          TypeError) as e:
    raise CheckpointError(f"{config_file}: {e}") from e
  prefix = find_checkpoint(path, step)
  with tempfile.TemporaryDirectory(prefix="albert_jax_tf_") as staging:
    return _read_checkpoint(prefix, _reader(prefix, staging), cfg,
                            overrides)


def _read_checkpoint(prefix: str, reader, cfg: ModelConfig,
                     overrides: Mapping[str, Any]) -> dict[str, Any]:
  """The `load` fields from the checkpoint `reader` reads (`prefix`)."""
  shapes = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}
  parts = detect_parts(shapes)
  table = entries(cfg, parts)
  foreign = sorted(k for k in shapes if not _skipped(k)
                   and not k.startswith(_MAPPED))
  summary = ", ".join(f"{k}={getattr(cfg, k)}" for k in (
      "vocab_size", "embedding_size", "hidden_size", "num_attention_heads",
      "intermediate_size", "num_hidden_groups", "inner_group_num",
      "max_position_embeddings", "type_vocab_size"))
  note = f" with overrides {dict(overrides)}" if overrides else ""
  try:
    tensor_map.check(shapes, table,
                 f"{prefix}: the variables do not fit {CONFIG_FILE}{note} "
                 f"({summary})",
                 ignore=lambda k: _skipped(k) or k in foreign)
  except ValueError as e:
    raise CheckpointError(str(e)) from e
  if parts["sop"] and not parts["pooler"]:
    raise CheckpointError(
        f"{prefix} has cls/seq_relationship but no bert/pooler, which that "
        "head reads.")
  if foreign:
    log.warning("%s: left out %d variables that albert_jax does not map "
                "(e.g. fine-tuning heads): %s", prefix, len(foreign),
                ", ".join(foreign[:8]) + (" ..." if len(foreign) > 8 else ""))
  params = tensor_map.assemble(table, reader.get_tensor, cfg.num_attention_heads)
  step = (int(reader.get_tensor("global_step")) if "global_step" in shapes
          else None)
  return dict(model_config=cfg, params=params, parts=parts, step=step,
              source=prefix)
