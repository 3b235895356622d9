"""HF transformers checkpoints ↔ albert_jax parameters.

ALBERT, BERT, RoBERTa and ELECTRA, in pure NumPy: reading and writing
`model.safetensors` needs neither torch nor transformers. Each family's
tensor table (`albert_jax.interop.hf_albert`, `hf_bert`) drives both
directions, so a conversion round trip is exact. Kernels are transposed from
torch's [out, in] layout and the attention projections reshaped to
[hidden, heads, head_dim] so tensor parallelism can split heads; layer
parameters are stacked on a leading copy axis.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from albert_jax.interop import hf_albert
from albert_jax.interop import hf_bert
from albert_jax.interop import tensor_map
from albert_jax.interop.hf_config import check_exportable
from albert_jax.interop.hf_config import config_from_hf
from albert_jax.interop.hf_config import config_to_hf
from albert_jax.interop.hf_config import infer_model_type
from albert_jax.interop.hf_config import model_type_of
from albert_jax.interop.hf_config import PARTS
from albert_jax.interop.hf_config import read_config
from albert_jax.interop.hf_config import SUPPORTED_MODEL_TYPES
from albert_jax.model.config import ModelConfig

__all__ = [
    "SUPPORTED_MODEL_TYPES", "PARTS", "architecture_for", "check_exportable",
    "config_from_hf", "config_to_hf", "detect_parts", "entries",
    "infer_model_type", "model_type_of", "params_from_hf", "params_to_hf",
    "read_config",
]

Params = dict[str, Any]

# Non-parameter buffers some checkpoints store; they carry no weights.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# Checkpoints converted from TF long ago (bert-base-uncased among them) name
# LayerNorm parameters as TF did; transformers renames them on load.
_LEGACY = ((".LayerNorm.gamma", ".LayerNorm.weight"),
           (".LayerNorm.beta", ".LayerNorm.bias"))


def _rename_legacy(state: Mapping[str, Any]) -> dict[str, Any]:
  out = {}
  for key, value in state.items():
    new = key
    for old_suffix, new_suffix in _LEGACY:
      if key.endswith(old_suffix):
        new = key[:-len(old_suffix)] + new_suffix
    if new != key and new in state:
      raise ValueError(f"the checkpoint holds both {key} and {new}, the same "
                       "LayerNorm parameter under its old and new name.")
    out[new] = value
  return out


def detect_parts(state: Mapping[str, Any], model_type: str = "albert"
                 ) -> dict[str, Any]:
  """Which parts a state dict holds: key "prefix", "pooler" and each head."""
  if model_type == "albert":
    return hf_albert.detect_parts(state)
  return hf_bert.detect_parts(state, model_type)


def entries(cfg: ModelConfig, parts: Mapping[str, Any],
            model_type: str = "albert") -> list[tensor_map.Entry]:
  """The HF tensors `cfg` implies for `parts`, in model order."""
  if model_type == "albert":
    return hf_albert.entries(cfg, parts)
  return hf_bert.entries(cfg, parts, model_type)


def _tied(parts, model_type):
  if model_type == "albert":
    return hf_albert.tied(parts)
  return hf_bert.tied(parts, model_type)


def _summary(cfg, model_type):
  if model_type == "albert":
    return hf_albert.summary(cfg)
  return hf_bert.summary(cfg)


def params_from_hf(state: Mapping[str, np.ndarray], cfg: ModelConfig,
                   model_type: str = "albert"
                   ) -> tuple[Params, dict[str, Any]]:
  """Converts an HF state dict.

  Args:
    state: HF tensor name → array, as `save_pretrained` writes them (with or
      without the base-model prefix; tied decoder copies, buffers and the
      legacy LayerNorm names `gamma` / `beta` allowed).
    cfg: the config the weights are meant for.
    model_type: the family, one of SUPPORTED_MODEL_TYPES.

  Returns:
    (params, parts): params as the `Albert` module lays them out, and
    `detect_parts(state, model_type)`.

  Raises:
    ValueError: a tensor is missing, unexpected or of the wrong shape (all
      are listed), or a stored tied copy differs from its source.
  """
  state = _rename_legacy(state)
  parts = detect_parts(state, model_type)
  table = entries(cfg, parts, model_type)
  tied = _tied(parts, model_type)
  tensor_map.check({k: np.shape(v) for k, v in state.items()}, table,
               "the weights do not fit config.json ("
               f"{_summary(cfg, model_type)})",
               ignore=lambda k: k.endswith(_BUFFERS) or k in tied)
  for copy, source in tied.items():
    if copy in state and (source not in state or not np.array_equal(
        np.asarray(state[copy]), np.asarray(state[source]))):
      raise ValueError(
          f"{copy} differs from the tensor it is tied to ({source}); "
          "albert_jax ties the MLM decoder to the word embeddings and its "
          "bias to the head's bias, so an untied checkpoint cannot be "
          "loaded.")
  return tensor_map.assemble(table, state.__getitem__,
                         cfg.num_attention_heads), parts


def architecture_for(parts: Mapping[str, bool], model_type: str = "albert"
                     ) -> str:
  """The HF class whose `save_pretrained` writes these parts."""
  if model_type == "albert":
    return hf_albert.architecture(parts)
  return hf_bert.architecture(parts, model_type)


def params_to_hf(params: Params, cfg: ModelConfig, model_type: str = "albert",
                 architecture: str | None = None) -> dict[str, np.ndarray]:
  """Inverse of `params_from_hf`.

  Args:
    params: an `Albert` parameter tree (unboxed); its pooler and heads are
      the parts written.
    cfg: its config.
    model_type: the family to write.
    architecture: the HF class the tensors are named for (it decides the
      base-model prefix); default `architecture_for` the parts.

  Returns:
    HF tensor name → contiguous array in the parameters' dtype, tied tensors
    omitted, as `save_pretrained` writes them.
  """
  parts: dict[str, Any] = {h: h in params
                           for h in ("pooler", "mlm", "sop", "rtd")}
  check_exportable(cfg, model_type, parts["pooler"],
                   tuple(h for h in ("mlm", "sop", "rtd") if parts[h]))
  architecture = architecture or architecture_for(parts, model_type)
  parts["prefix"] = (hf_albert.prefix(architecture) if model_type == "albert"
                     else hf_bert.prefix(model_type, architecture))
  return tensor_map.disassemble(params, entries(cfg, parts, model_type))
