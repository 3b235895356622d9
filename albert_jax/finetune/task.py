"""What a fine-tuning task is, and the model every task shares.

A `Task` turns a dataset split into fixed-shape feature arrays, supplies the
head that sits on the encoder, its loss in sum form (so gradient accumulation
is exact, as in pre-training), per-row predictions, the official metrics and
the prediction files. The one fine-tuning loop (`albert_jax.finetune.train`)
drives any task through this interface; nothing task-specific lives there.

Conventions every task follows:
  * `Split.features` holds numpy arrays with a common leading dim N (rows the
    model sees: examples for GLUE, document windows for SQuAD). Model inputs
    are "input_ids", "token_type_ids", "attention_mask", each [N, T] (or
    [N, C, T] for multiple choice, C choices per row), int32.
  * The loop adds "weights" [N] float32 (1 for real rows, 0 for the rows that
    pad the last eval batch); `loss_sums` must weight every row by it.
  * `predict` runs inside jit on a batch; `evaluate` and `write_predictions`
    run on the host on all of a split's predictions, in row order, padding
    rows removed.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import models
from albert_jax.model_config import ModelConfig

INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


@dataclasses.dataclass
class Split:
  """One split's features, ready for batching.

  Attributes:
    name: the split's name as the task knows it ("validation_matched").
    features: name → array with leading dim N (see the module docstring).
    examples: whatever turns row predictions into per-example outputs and
      metrics (SQuAD contexts and offsets, GLUE `idx` for submission files).
    has_labels: False for unlabeled (test) splits: no metrics, only files.
  """
  name: str
  features: dict[str, np.ndarray]
  examples: Any = None
  has_labels: bool = True

  @property
  def num_rows(self) -> int:
    return int(self.features["input_ids"].shape[0])


class Task(abc.ABC):
  """A fine-tuning task. Subclasses set the class attributes below.

  Attributes:
    name: e.g. "glue/mrpc", "squad/v2.0", "race/high", "files".
    metric: the key of `evaluate`'s result that selects the best checkpoint
      (higher is better). With several eval splits, the first split's.
    train_split: the split trained on.
    eval_splits: labelled splits evaluated every `eval_every_steps`.
    predict_splits: splits whose predictions are written at the end
      (e.g. GLUE test sets for a submission); may repeat eval splits.
  """
  name: str
  metric: str
  train_split: str = "train"
  eval_splits: tuple[str, ...] = ("validation",)
  predict_splits: tuple[str, ...] = ()

  @abc.abstractmethod
  def load(self, split: str, tokenizer, max_seq_length: int) -> Split:
    """Reads and featurizes one split."""

  @abc.abstractmethod
  def head(self, model_config: ModelConfig) -> nn.Module:
    """The head module, called as `head(encoded, batch, deterministic)`.

    `encoded` has "sequence_output" [N(, C), T, H] and "pooled_output"
    [N(, C), H]; it returns a dict of arrays (logits) with leading dim N.
    """

  @abc.abstractmethod
  def loss_sums(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    """Sums over the batch's rows, weighted by `batch["weights"]`.

    Must include "loss_sum"; the loss is loss_sum / Σ weights over the whole
    (accumulated) batch. Other entries ("correct_sum", ...) are summed the
    same way and shown by `train_metrics`.
    """

  def train_metrics(self, sums: dict, count: jax.Array) -> dict[str, Any]:
    """Training metrics from the sums and the number of rows."""
    count = jnp.maximum(count, 1.0)
    out = {"loss": sums["loss_sum"] / count}
    if "correct_sum" in sums:
      out["accuracy"] = sums["correct_sum"] / count
    return out

  @abc.abstractmethod
  def predict(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    """Per-row predictions (leading dim N), computed inside jit."""

  @abc.abstractmethod
  def evaluate(self, predictions: dict[str, np.ndarray],
               split: Split) -> dict[str, float]:
    """Official metrics of a labelled split from all its rows' predictions."""

  @abc.abstractmethod
  def write_predictions(self, predictions: dict[str, np.ndarray],
                        split: Split, directory: str) -> list[str]:
    """Writes the split's prediction files into `directory`; returns paths."""


class FineTuneModel(nn.Module):
  """The pre-trained encoder (under "albert") with a task head ("head").

  The encoder's parameters carry the pre-training names, so a checkpoint's
  embeddings/encoder/pooler drop into `params["albert"]` unchanged.
  """
  config: ModelConfig
  head: nn.Module

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True) -> dict:
    """batch: INPUT_KEYS [N, T] or [N, C, T] (+ labels) → head outputs."""
    ids = batch["input_ids"]
    lead, length = ids.shape[:-1], ids.shape[-1]
    flat = {k: batch[k].reshape((-1, length)) for k in INPUT_KEYS}
    encoded = models.Albert(self.config, pooler=True, heads=(),
                            name="albert")(
                                flat["input_ids"], flat["token_type_ids"],
                                flat["attention_mask"],
                                deterministic=deterministic)
    encoded = {k: v.reshape(lead + v.shape[1:]) for k, v in encoded.items()}
    return self.head(encoded, batch, deterministic)
