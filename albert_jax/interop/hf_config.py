"""HF `config.json` ↔ ModelConfig for ALBERT, BERT, RoBERTa and ELECTRA.

Keys a config.json leaves out take the defaults of the transformers config
class of its model type, not ModelConfig's. Variants albert_jax does not
implement (relative positions, decoders, cross-attention) are refused by
name rather than loaded into a model that computes something else.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from albert_jax import storage
from albert_jax.interop import child
from albert_jax.model.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("albert", "bert", "electra", "roberta")

# Every family's config.json key → ModelConfig field of the same name.
_SHARED_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "max_position_embeddings",
    "type_vocab_size", "initializer_range", "layer_norm_eps")
CONFIG_KEYS = {
    "albert": _SHARED_KEYS + ("embedding_size", "num_hidden_groups",
                              "inner_group_num", "classifier_dropout_prob"),
    "bert": _SHARED_KEYS + ("pad_token_id",),
    "roberta": _SHARED_KEYS + ("pad_token_id",),
    "electra": _SHARED_KEYS + ("embedding_size", "pad_token_id"),
}

_BERT_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
    "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}
# The transformers config classes' defaults (AlbertConfig's is the xxlarge
# shape, ElectraConfig's the small discriminator).
DEFAULTS = {
    "albert": {
        "vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096,
        "num_hidden_layers": 12, "num_attention_heads": 64,
        "intermediate_size": 16384, "num_hidden_groups": 1,
        "inner_group_num": 1, "hidden_act": "gelu_new",
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "classifier_dropout_prob": 0.1, "max_position_embeddings": 512,
        "type_vocab_size": 2, "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
    },
    "bert": _BERT_DEFAULTS,
    "roberta": {**_BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1},
    "electra": {**_BERT_DEFAULTS, "embedding_size": 128, "hidden_size": 256,
                "num_attention_heads": 4, "intermediate_size": 1024},
}

# The parts each family's classes can hold.
PARTS = {"albert": ("pooler", "mlm", "sop"), "bert": ("pooler", "mlm", "sop"),
         "roberta": ("pooler", "mlm"), "electra": ("mlm", "rtd")}

# A family's class names, for configs from before `model_type` existed.
_CLASS_NAME = re.compile(r"(Albert|Bert|Roberta|Electra)[A-Z]")


def read_config(path: str) -> dict[str, Any]:
  """The parsed `config.json` of checkpoint directory `path`."""
  file = child(path, "config.json")
  try:
    config = json.loads(storage.path(file).read_bytes())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{file} is not valid JSON: {e}") from e
  if not isinstance(config, dict):
    raise ValueError(f"{file} holds a {type(config).__name__}, not a JSON "
                     "object of config fields.")
  return config


def model_type_of(hf: Mapping[str, Any]) -> str:
  """The config's family, one of SUPPORTED_MODEL_TYPES.

  Raises:
    ValueError: another model type, naming the supported ones.
  """
  model_type = hf.get("model_type")
  if model_type is None:
    for arch in hf.get("architectures") or ():
      match = _CLASS_NAME.match(str(arch))
      if match:
        model_type = match.group(1).lower()
        break
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(
        f"config.json has model_type={model_type!r}; albert_jax reads "
        f"checkpoints of model types {', '.join(SUPPORTED_MODEL_TYPES)}.")
  return model_type


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
  """ModelConfig from an HF `config.json` dict of a supported family.

  Raises:
    ValueError: an unsupported model type, or a variant of a supported one
      (relative position embeddings, a decoder) that albert_jax does not
      implement.
  """
  model_type = model_type_of(hf)
  position = hf.get("position_embedding_type") or "absolute"
  if position != "absolute":
    raise ValueError(
        f"config.json has position_embedding_type={position!r}; albert_jax "
        "implements only absolute position embeddings.")
  for flag in ("is_decoder", "add_cross_attention"):
    if hf.get(flag):
      raise ValueError(
          f"config.json sets {flag}=true; albert_jax implements bidirectional "
          "encoders without cross-attention only.")
  defaults = DEFAULTS[model_type]
  values = {k: defaults[k] if hf.get(k) is None else hf[k]
            for k in CONFIG_KEYS[model_type]}
  if model_type == "albert":
    labels = hf.get("id2label")
    if labels:  # AlbertSOPHead is sized by num_labels.
      values["num_sentence_labels"] = len(labels)
    return ModelConfig(share="all", embedding_projection=True, **values)
  # BERT-family classifier dropout falls back to hidden dropout, as in HF.
  dropout = hf.get("classifier_dropout")
  values["classifier_dropout_prob"] = (values["hidden_dropout_prob"]
                                       if dropout is None else dropout)
  if model_type == "electra":
    projection = values["embedding_size"] != values["hidden_size"]
  else:
    values["embedding_size"] = values["hidden_size"]
    projection = False
  return ModelConfig(
      share="none", embedding_projection=projection,
      # RoBERTa's LM head and ELECTRA's generator head hard-code erf GELU.
      mlm_hidden_act="" if model_type == "bert" else "gelu",
      position_ids_from_padding=model_type == "roberta", **values)


def infer_model_type(cfg: ModelConfig, heads: tuple[str, ...]) -> str:
  """The HF family a model's structure belongs to, for export."""
  if cfg.position_ids_from_padding:
    return "roberta"
  if cfg.share == "all" and cfg.embedding_projection:
    return "albert"
  if cfg.share == "none" and ("rtd" in heads or cfg.embedding_projection):
    return "electra"
  if cfg.share == "none":
    return "bert"
  raise ValueError(
      f"share={cfg.share!r} with embedding_projection="
      f"{cfg.embedding_projection} has no HF transformers equivalent: ALBERT "
      "shares every layer and projects E→H, BERT/RoBERTa/ELECTRA share none.")


def check_exportable(cfg: ModelConfig, model_type: str, pooler: bool,
                     heads: tuple[str, ...]) -> None:
  """Raises ValueError listing why the model has no `model_type` equivalent."""
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"Unknown model_type {model_type!r}; choose one of "
                     f"{SUPPORTED_MODEL_TYPES}.")
  wrong = []
  if model_type == "albert":
    if cfg.share != "all" or not cfg.embedding_projection:
      wrong.append("HF's ALBERT shares every layer and always projects E→H "
                   f"(this model: share={cfg.share!r}, embedding_projection="
                   f"{cfg.embedding_projection})")
  else:
    if cfg.share != "none" or cfg.inner_group_num != 1:
      wrong.append(f"{model_type} shares no layers and has one block per "
                   f"layer (share={cfg.share!r}, inner_group_num="
                   f"{cfg.inner_group_num})")
    want_projection = (model_type == "electra"
                       and cfg.embedding_size != cfg.hidden_size)
    if cfg.embedding_projection != want_projection:
      wrong.append(f"{model_type} projects embeddings exactly when "
                   "embedding_size != hidden_size (this model: "
                   f"embedding_projection={cfg.embedding_projection}, "
                   f"E={cfg.embedding_size}, H={cfg.hidden_size})")
  if cfg.position_ids_from_padding != (model_type == "roberta"):
    wrong.append("only RoBERTa derives positions from the padding "
                 f"(position_ids_from_padding={cfg.position_ids_from_padding})")
  if "mlm" in heads:
    want_act = {"albert": cfg.hidden_act, "bert": cfg.hidden_act,
                "roberta": "gelu", "electra": "gelu"}[model_type]
    if cfg.mlm_activation != want_act:
      wrong.append(f"{model_type}'s MLM head uses {want_act!r}, this model "
                   f"{cfg.mlm_activation!r}")
  if "sop" in heads and model_type in ("roberta", "electra"):
    wrong.append(f"{model_type} has no sentence-pair head")
  if "sop" in heads and model_type == "bert" and cfg.num_sentence_labels != 2:
    wrong.append(f"BERT's NSP head has 2 labels, not "
                 f"{cfg.num_sentence_labels}")
  if "rtd" in heads and model_type != "electra":
    wrong.append("only ELECTRA has a replaced-token-detection head")
  if model_type == "electra" and "mlm" in heads and "rtd" in heads:
    wrong.append("ELECTRA's generator (MLM) and discriminator (RTD) are "
                 "separate HF models; export each on its own")
  if model_type == "electra" and pooler:
    wrong.append("ELECTRA has no pooler")
  if wrong:
    raise ValueError(f"This model cannot be written as an HF {model_type} "
                     "checkpoint: " + "; ".join(wrong) + ".")


def config_to_hf(cfg: ModelConfig, model_type: str, architecture: str
                 ) -> dict[str, Any]:
  """HF `config.json` dict for `cfg` (checked by `check_exportable`)."""
  out = {k: getattr(cfg, k) for k in CONFIG_KEYS[model_type]}
  out.update(model_type=model_type, architectures=[architecture],
             dtype=cfg.param_dtype, tie_word_embeddings=True)
  if model_type == "albert":
    out.update(pad_token_id=cfg.pad_token_id, bos_token_id=2, eos_token_id=3,
               id2label={str(i): f"LABEL_{i}"
                         for i in range(cfg.num_sentence_labels)},
               label2id={f"LABEL_{i}": i
                         for i in range(cfg.num_sentence_labels)})
  else:
    out.update(classifier_dropout=cfg.classifier_dropout_prob,
               position_embedding_type="absolute")
  if model_type == "roberta":
    out.update(bos_token_id=0, eos_token_id=2)
  return out
