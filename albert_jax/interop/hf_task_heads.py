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
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from albert_jax import storage
from albert_jax.interop import child
from albert_jax.interop import hf
from albert_jax.interop import hf_config as hf_config_lib

_SUFFIX = {"classification": "ForSequenceClassification",
           "regression": "ForSequenceClassification",
           "question_answering": "ForQuestionAnswering",
           "multiple_choice": "ForMultipleChoice",
           "token_classification": "ForTokenClassification"}
_FAMILY = {"albert": "Albert", "bert": "Bert", "roberta": "Roberta",
           "electra": "Electra"}
# (task type, family) → whether the HF class holds the encoder's pooler.
_POOLED = ("classification", "regression", "multiple_choice")


def architecture(task_type: str, model_type: str) -> str:
  """The transformers class of a task type in a family."""
  return _FAMILY[model_type] + _SUFFIX[task_type]


def _check(task_type: str, model_type: str, settings: dict) -> None:
  if task_type == "question_answering" and settings.get(
      "head_kind") == "official":
    raise ValueError(
        "This model has ALBERT's official SQuAD v2.0 head (start logits, "
        "end logits conditioned on the start, and an answer-class logit), "
        "which no transformers class holds; AlbertForQuestionAnswering is "
        "the plain span head. Fine-tune with --config.data.v2_head=simple "
        "to export.")
  if model_type == "electra" and task_type in _POOLED:
    raise ValueError(
        f"transformers' {architecture(task_type, model_type)} reads [CLS] "
        "through dense + GELU, and this model's head reads it through the "
        "pooler's dense + tanh, so no ELECTRA class computes it; export as "
        "model_type='bert' (the same encoder without the embedding "
        "projection) or fine-tune a token-classification or span head.")


def head_tensors(task_type: str, model_type: str, params: dict
                 ) -> dict[str, np.ndarray]:
  """The HF head's tensors (torch [out, in] layout) from our parameters
  ({"albert": ..., "head": ...})."""
  head = params["head"]
  def linear(name, p):
    return {f"{name}.weight": np.ascontiguousarray(
        np.asarray(p["kernel"]).reshape(np.shape(p["kernel"])[0], -1).T),
            f"{name}.bias": np.asarray(p["bias"]).reshape(-1)}
  if task_type == "question_answering":
    return linear("qa_outputs", head["output"])
  if task_type == "multiple_choice":
    return linear("classifier", head["output"])
  if task_type == "token_classification":
    return linear("classifier", head["classifier"])
  if model_type == "roberta":
    return {**linear("classifier.dense", params["albert"]["pooler"]),
            **linear("classifier.out_proj", head["classifier"])}
  return linear("classifier", head["classifier"])


def to_hf(model, path: str, model_type: str | None = None) -> None:
  """Writes a `FineTuned` as a transformers task checkpoint directory
  (config.json with id2label/label2id, model.safetensors, the tokenizer).

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
  _check(model.task_type, model_type, model.settings)
  arch = architecture(model.task_type, model_type)
  params = jax.tree.map(np.asarray, model.params)
  encoder = dict(params["albert"])
  encoder.pop("lm", None)
  # RoBERTa's sequence classifier computes the pooler inside its head.
  keep_pooler = model.task_type in _POOLED and not (
      model_type == "roberta" and model.task_type != "multiple_choice")
  if not keep_pooler:
    encoder.pop("pooler", None)
  state = hf.params_to_hf(encoder, cfg, model_type, architecture=arch)
  state.update(head_tensors(model.task_type, model_type, params))
  config = hf_config_lib.config_to_hf(cfg, model_type, arch)
  labels = (list(model.labels) if model.labels is not None else
            ["LABEL_0"] if model.task_type == "regression" else None)
  for key in ("id2label", "label2id"):
    config.pop(key, None)
  if labels is not None:
    config["id2label"] = {str(i): name for i, name in enumerate(labels)}
    config["label2id"] = {name: i for i, name in enumerate(labels)}
  if model.task_type == "regression":
    config["problem_type"] = "regression"
  elif model.task_type == "classification":
    config["problem_type"] = "single_label_classification"
  storage.path(path).mkdir(parents=True, exist_ok=True)
  storage.write_atomic(child(path, "config.json"),
                       json.dumps(config, indent=2))
  storage.write_atomic(child(path, "model.safetensors"),
                       save(state, metadata={"format": "pt"}))
  if model.tokenizer is not None:
    model.tokenizer.save(path)


def task_type_of(hf_config: dict) -> str | None:
  """The task type of an HF config's architecture, or None (not a task
  class albert_jax reads)."""
  for arch in hf_config.get("architectures") or ():
    for task_type, suffix in _SUFFIX.items():
      if str(arch).endswith(suffix) and str(arch)[:-len(suffix)] in (
          _FAMILY.values()):
        if task_type in ("classification", "regression"):
          return ("regression" if hf_config.get("problem_type")
                  == "regression" else "classification")
        return task_type
  return None


def from_hf(path: str, hf_config: dict, task_type: str, overrides: dict,
            state: dict[str, np.ndarray]) -> dict[str, Any]:
  """The fields of a `FineTuned` from an HF task checkpoint's config and
  tensors (the inverse of `to_hf`)."""
  from albert_jax.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  model_type = hf_config_lib.model_type_of(hf_config)
  cfg = hf_config_lib.config_from_hf(hf_config)
  if overrides:
    cfg = ModelConfig.from_dict({**cfg.to_dict(), **overrides})
  state = dict(state)
  prefix = f"{model_type}."
  def take(name):
    w, b = state.pop(f"{name}.weight"), state.pop(f"{name}.bias")
    return {"kernel": np.ascontiguousarray(np.asarray(w).T),
            "bias": np.asarray(b)}
  head_name = {"question_answering": "qa_outputs"}.get(task_type,
                                                       "classifier")
  if model_type == "roberta" and task_type in ("classification",
                                               "regression"):
    pooler = take("classifier.dense")
    head = take("classifier.out_proj")
    state[f"{prefix}pooler.dense.weight"] = pooler["kernel"].T
    state[f"{prefix}pooler.dense.bias"] = pooler["bias"]
  else:
    head = take(head_name)
  encoder, _ = hf.params_from_hf(state, cfg, model_type)
  if task_type == "question_answering":
    head_params = {"output": head}
  elif task_type == "multiple_choice":
    head_params = {"output": head}
  else:
    head_params = {"classifier": head}
  if task_type in _POOLED and "pooler" not in encoder:
    raise ValueError(f"{path}: a {task_type} head reads the pooler, and the "
                     "checkpoint has no pooler weights.")
  if task_type not in _POOLED:
    # Our models always build the pooler; it is unused by these heads.
    h = cfg.hidden_size
    dtype = np.asarray(head["kernel"]).dtype
    encoder["pooler"] = {"kernel": np.zeros((h, h), dtype),
                         "bias": np.zeros((h,), dtype)}
  id2label = hf_config.get("id2label") or {}
  labels = None
  if task_type in ("classification", "token_classification"):
    labels = [id2label[k] for k in sorted(id2label, key=int)]
  limit = cfg.max_position_embeddings - (2 if model_type == "roberta"
                                         else 0)
  settings = {"task_type": task_type, "labels": labels,
              "max_seq_length": min(limit, 512), "lm_head": False,
              "model": cfg.to_dict(), "text_columns": None,
              "head_kind": "span", "version_2": False, "start_n_top": 5,
              "end_n_top": 5, "doc_stride": 128, "max_query_length": 64,
              "n_best_size": 20, "max_answer_length": 30,
              "null_threshold": None, "max_qa_length": 64,
              "task": architecture(task_type, model_type)}
  return dict(task=settings["task"], task_type=task_type, labels=labels,
              model_config=cfg,
              params={"albert": encoder, "head": head_params},
              settings=settings, path=os.fspath(path))
