"""What a recorded fine-tuned model is: one `TaskType` per task.json
"task_type".

A fine-tuning run records its task's `Task.describe()` in the workdir's
`task.json` (`albert_jax.finetune.serving.fine_tuned.record`). Everything that works
from that record asks the `TaskType` its "task_type" names
(`registry.task_type`): whether the type's own fields are sound, the head to
rebuild and the model inputs of one row (`fine_tuned.spec_from_record`), raw
inputs → features → JSON predictions (`FineTuned.predict`), a file's rows →
inputs (`prediction_files`) and its transformers task class's head tensors
(`albert_jax.interop.hf_task_heads`). Each type lives in its family's
folder (`albert_jax/finetune/tasks/`), which lists it in its `TASK_TYPES`:
classification and regression in `classification/single_label.py`,
multiple choice in `multiple_choice/choices.py`, token classification in
`tagging/ner.py`, question answering in `squad/task_type.py`. So a new kind
of fine-tuned model comes with its family's folder, and no generic code asks
which kind a model is.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

import flax.linen as nn
import numpy as np

from albert_jax.finetune.task import INPUT_KEYS
from albert_jax.interop import hf_task_heads
from albert_jax.model.config import ModelConfig


class PredictError(ValueError):
  """Inputs a fine-tuned model cannot predict on, with the fix."""


class TaskType(abc.ABC):
  """One kind of fine-tuned model, as its task.json records it.

  `info` below is a task.json as a dict: "task_type", "task", "labels",
  "max_seq_length", "lm_head", "model" and the type's own settings (its
  tasks' `describe()`); `model` is an `albert_jax.finetune.serving.fine_tuned.
  FineTuned`, which called on features returns the head's outputs.

  Attributes:
    name: the task.json "task_type" ("classification", ...).
    labelled: the model names its classes (task.json "labels": two or more
      distinct names, in class order).
    pooled: the head reads the pooled [CLS] output (transformers' class then
      holds the encoder's pooler).
    problem_type: transformers' config "problem_type", or None to leave it
      unset.
    hf_class: transformers' task class, less the family's name
      ("ForSequenceClassification": AlbertForSequenceClassification, ...),
      or None where transformers has none (the model is then not
      exported, and no transformers checkpoint loads as this type).
    head_layer, hf_head: the head's linear layer in our parameters and in
      transformers' class (`head_to_hf`, `head_from_hf`).
    packable: a row can hold several inputs (`albert_jax.finetune.
      packing`), and prediction packs them.
    token_keys: the head's per-token outputs (put back per input token by
      token when packed); the others are one per input.
  """
  name: str
  # The head's one linear layer: our name, and transformers'.
  head_layer: str = "output"
  hf_head: str = "classifier"
  labelled: bool = False
  pooled: bool = True
  problem_type: str | None = None
  hf_class: str | None = None
  packable: bool = False
  token_keys: tuple[str, ...] = ()

  def task_info_problem(self, info: dict) -> str | None:
    """What is wrong with this type's own fields of `info` (its common
    fields, "max_seq_length" included, are already checked), or None."""
    labels = info.get("labels")
    if self.labelled and (
        not isinstance(labels, list) or len(labels) < 2
        or not all(isinstance(x, str) for x in labels)
        or len(set(labels)) != len(labels)):
      return (f"labels {labels!r} are not a list of two or more distinct "
              "label names")
    return None

  @abc.abstractmethod
  def head(self, info: dict, cfg: ModelConfig) -> nn.Module:
    """The task head `info` describes, on encoder `cfg`."""

  def features(self, max_seq_length: int
               ) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The model inputs of one row: name → (shape, dtype). This default:
    INPUT_KEYS [T] int32."""
    return {k: ((max_seq_length,), np.int32) for k in INPUT_KEYS}

  @abc.abstractmethod
  def predict(self, model, items: list, batch_size: int,
              **options) -> list[dict]:
    """One JSON-serialisable prediction per raw input of `items`
    (non-empty), featurized as the task featurized its data.

    Raises:
      PredictError: an input of the wrong form, or an unknown option.
    """

  def file_input(self, row: dict, settings: dict,
                 columns: Sequence[str] | None) -> Any:
    """A file's row (column → value) as `predict`'s input; `columns` are
    the user's --columns (None: those the task trained on). This default:
    the row itself."""
    del settings, columns
    return row

  # What albert_jax.interop.hf_task_heads asks of the type.

  def check_export(self, settings: dict) -> None:
    """Raises ValueError where a head with `settings` has no transformers
    class. This default: where the type has none."""
    del settings
    if self.hf_class is None:
      raise ValueError(f"A {self.name} model has no transformers task "
                       "class to export to.")

  def reads_hf(self, hf_config: dict) -> bool:
    """Whether a transformers checkpoint of class `hf_class` with config
    `hf_config` is this type (several types may share a class)."""
    del hf_config
    return True

  def hf_pooler(self, model_type: str) -> bool:
    """Whether transformers' class of `model_type` holds the encoder's
    pooler."""
    del model_type
    return self.pooled

  def head_to_hf(self, params: dict, model_type: str
                 ) -> dict[str, np.ndarray]:
    """transformers' head tensors (torch [out, in] layout) from our
    {"albert": ..., "head": ...} parameters: by default one linear layer,
    ours `head_layer`, transformers' `hf_head`."""
    del model_type
    return hf_task_heads.linear(self.hf_head,
                                params["head"][self.head_layer])

  def head_from_hf(self, state: dict[str, np.ndarray],
                   model_type: str) -> dict:
    """Our head parameters from a transformers task checkpoint's tensors,
    popping the head's from `state` (what is left is the encoder's)."""
    del model_type
    return {self.head_layer: hf_task_heads.take(state, self.hf_head)}

  def hf_labels(self, labels: Sequence[str] | None) -> list[str] | None:
    """The id2label names to export (None: none)."""
    return None if labels is None else list(labels)

  def imported_settings(self) -> dict[str, Any]:
    """The type's own task.json settings for a transformers checkpoint,
    which records none: the defaults its tasks train with."""
    return {}


def softmax(x: np.ndarray) -> np.ndarray:
  """Row-wise softmax in float64. [..., K] → [..., K]."""
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)
