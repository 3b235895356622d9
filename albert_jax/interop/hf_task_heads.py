"""Fine-tuned task heads ↔ transformers' task classes.

  classification, regression  {Family}ForSequenceClassification
  question_answering          {Family}ForQuestionAnswering (span head only)
  multiple_choice             {Family}ForMultipleChoice
  token_classification        {Family}ForTokenClassification

for the families ALBERT, BERT, RoBERTa and ELECTRA. Our classification and
multiple-choice heads read the [CLS] pooler (dense + tanh) and a dense
layer; ALBERT's and BERT's classes hold the same two. RoBERTa's sequence
classifier has no pooler but computes the same thing in its head
(`classifier.dense` + tanh, `classifier.out_proj`), where our pooler and
dense go. ELECTRA's sequence and multiple-choice heads use GELU where the
pooler has tanh, so those two are refused, as is ALBERT's official SQuAD
v2.0 head (its answer-class and conditioned end layers have no transformers
class). Token and span heads read every token and no pooler.

Label names travel as `id2label` / `label2id`; regression sets
`problem_type="regression"`.

What differs by task type (transformers' class, the head's tensor names,
whether the class holds the pooler, labels, problem_type, the heads refused,
the settings an imported model records) belongs to the task type
(`albert_jax.finetune.task_type.TaskType`), which `to_hf` and `from_hf` take
as an argument: fine-tuning sits above interop, so interop never imports
the types, and a new one brings its conversion with it. What stays here is
transformers' side: the families, the encoder and config conversion, the
files, and which classes are encoders (`ENCODER_CLASSES`): every other
`{Family}For{Task}` class is a task checkpoint (`task_class`), refused as
an encoder and converted by the type whose `hf_class` it is.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np

from albert_jax import storage
from albert_jax.interop import child
from albert_jax.interop import hf
from albert_jax.interop import hf_config as hf_config_lib

# transformers' classes of an encoder without a task head, less the
# family's name: read as pre-trained encoders (`albert_jax.interop.hf`).
ENCODER_CLASSES = ("Model", "ForPreTraining", "ForMaskedLM",
                   "ForNextSentencePrediction", "ForCausalLM")
_FAMILY = {"albert": "Albert", "bert": "Bert", "roberta": "Roberta",
           "electra": "Electra"}


def architecture(kind, model_type: str) -> str:
  """The transformers class of task type `kind` (its `hf_class`) in a
  family."""
  return _FAMILY[model_type] + kind.hf_class


def linear(name: str, p: dict) -> dict[str, np.ndarray]:
  """A dense layer's parameters ({"kernel" [in, ...], "bias"}) as
  transformers' `{name}.weight` [out, in] and `{name}.bias` [out]."""
  return {f"{name}.weight": np.ascontiguousarray(
      np.asarray(p["kernel"]).reshape(np.shape(p["kernel"])[0], -1).T),
          f"{name}.bias": np.asarray(p["bias"]).reshape(-1)}


def take(state: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
  """transformers' dense layer `name` popped from `state`, as our
  {"kernel" [in, out], "bias" [out]} (the inverse of `linear`)."""
  w, b = state.pop(f"{name}.weight"), state.pop(f"{name}.bias")
  return {"kernel": np.ascontiguousarray(np.asarray(w).T),
          "bias": np.asarray(b)}


def to_hf(model, path: str, model_type: str | None, kind) -> None:
  """Writes a `FineTuned` as a transformers task checkpoint directory
  (config.json with id2label/label2id, model.safetensors, the tokenizer).

  Args:
    model: the `albert_jax.finetune.serving.fine_tuned.FineTuned`.
    path: the directory, local or gs://.
    model_type: the family to write (None: the one the config matches).
    kind: its task type (`albert_jax.finetune.task_type.TaskType`), which
      gives the head's tensors, whether the class holds the pooler, the
      labels and problem_type, and refuses heads without a class.

  Raises:
    ValueError: the head or the family has no transformers class (the
      message says why).
  """
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
  cfg = model.model_config
  model_type = model_type or hf_config_lib.infer_model_type(cfg, ())
  if model_type not in _FAMILY:
    raise ValueError(f"Unknown model_type {model_type!r}; choose one of "
                     f"{tuple(_FAMILY)}.")
  kind.check_export(model.settings)
  arch = architecture(kind, model_type)
  if model_type == "electra" and kind.pooled:
    raise ValueError(
        f"transformers' {arch} reads [CLS] through dense + GELU, and this "
        "model's head reads it through the pooler's dense + tanh, so no "
        "ELECTRA class computes it; export as model_type='bert' (the same "
        "encoder without the embedding projection) or fine-tune a "
        "token-classification or span head.")
  params = jax.tree.map(np.asarray, model.params)
  encoder = dict(params["albert"])
  encoder.pop("lm", None)
  if not kind.hf_pooler(model_type):
    encoder.pop("pooler", None)
  state = hf.params_to_hf(encoder, cfg, model_type, architecture=arch)
  state.update(kind.head_to_hf(params, model_type))
  config = hf_config_lib.config_to_hf(cfg, model_type, arch)
  labels = kind.hf_labels(model.labels)
  for key in ("id2label", "label2id"):
    config.pop(key, None)
  if labels is not None:
    config["id2label"] = {str(i): name for i, name in enumerate(labels)}
    config["label2id"] = {name: i for i, name in enumerate(labels)}
  if kind.problem_type is not None:
    config["problem_type"] = kind.problem_type
  storage.path(path).mkdir(parents=True, exist_ok=True)
  storage.write_atomic(child(path, "config.json"),
                       json.dumps(config, indent=2))
  storage.write_atomic(child(path, "model.safetensors"),
                       save(state, metadata={"format": "pt"}))
  if model.tokenizer is not None:
    model.tokenizer.save(path)


def task_class(hf_config: dict) -> str | None:
  """The task class of an HF config's architecture, less the family's name
  ("ForSequenceClassification"), or None (an encoder class, or none)."""
  for arch in map(str, hf_config.get("architectures") or ()):
    for family in _FAMILY.values():
      if arch.startswith(family + "For"):
        suffix = arch[len(family):]
        if suffix not in ENCODER_CLASSES:
          return suffix
  return None


def from_hf(checkpoint, kind) -> dict[str, Any]:
  """The fields of a `FineTuned` (but its tokenizer) from a transformers
  task checkpoint (the inverse of `to_hf`).

  Args:
    checkpoint: the `sources.TaskCheckpoint` read from its directory.
    kind: its task type (`albert_jax.finetune.task_type.TaskType`), which
      reads the head's tensors and gives the type's settings.
  """
  from albert_jax.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  hf_config = checkpoint.hf_config
  model_type = hf_config_lib.model_type_of(hf_config)
  cfg = hf_config_lib.config_from_hf(hf_config)
  if checkpoint.overrides:
    cfg = ModelConfig.from_dict({**cfg.to_dict(), **checkpoint.overrides})
  state = dict(checkpoint.state)
  head = kind.head_from_hf(state, model_type)
  encoder, _ = hf.params_from_hf(state, cfg, model_type)
  if kind.pooled and "pooler" not in encoder:
    raise ValueError(f"{checkpoint.path}: a {kind.name} head reads the "
                     "pooler, and the checkpoint has no pooler weights.")
  if not kind.pooled:
    # Our models always build the pooler; it is unused by these heads.
    h = cfg.hidden_size
    dtype = next(iter(head.values()))["kernel"].dtype
    encoder["pooler"] = {"kernel": np.zeros((h, h), dtype),
                         "bias": np.zeros((h,), dtype)}
  id2label = hf_config.get("id2label") or {}
  labels = None
  if kind.labelled:
    labels = [id2label[k] for k in sorted(id2label, key=int)]
  limit = cfg.max_position_embeddings - (2 if model_type == "roberta"
                                         else 0)
  settings = {"task_type": kind.name, "labels": labels,
              "max_seq_length": min(limit, 512), "lm_head": False,
              "model": cfg.to_dict(), **kind.imported_settings(),
              "task": architecture(kind, model_type)}
  return dict(task=settings["task"], task_type=kind.name, labels=labels,
              model_config=cfg,
              params={"albert": encoder, "head": head},
              settings=settings, path=checkpoint.path)
