"""What a fine-tuning task is, and the model every task shares.

A `Task` turns a dataset split into fixed-shape feature arrays, supplies the
head that sits on the encoder, its loss in sum form (so gradient accumulation
is exact, as in pre-training), per-row predictions, the official metrics and
the prediction files. The one fine-tuning loop (`albert_jax.finetune.run`)
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

`TaskObjective` makes a task the train step's objective. GPT-1 (Radford et
al. 2018, sec. 3.2) fine-tunes a causal model on the task loss plus λ × its
next-token loss on the task's own input text: `FineTuneModel` with
`lm_head=True` keeps the pre-trained tied "lm" head for that, `lm_aux_sums` is that loss in
sum form, and `TaskObjective(..., lm_aux_weight=λ)` adds it.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.finetune import packing
from albert_jax.model import albert as albert_lib
from albert_jax.model import encoder as encoder_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives

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
  # Whether rows can hold several examples (`config.data.pack`): the head
  # and losses read [N, K, ...] per-example outputs (`finetune.packing`),
  # or per-token ones of `token_keys` (features and predictions laid out as
  # the tokens, besides INPUT_KEYS), each example's tokens told apart by
  # `packing.token_slots`.
  packable: bool = False
  token_keys: tuple[str, ...] = ()
  train_split: str = "train"
  eval_splits: tuple[str, ...] = ("validation",)
  predict_splits: tuple[str, ...] = ()

  @abc.abstractmethod
  def load(self, split: str, tokenizer, max_seq_length: int) -> Split:
    """Reads and featurizes one split."""

  def batch_features(self, max_seq_length: int
                     ) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The features the head, `loss_sums` and `predict` read: name →
    (shape of one row, dtype), each as `load` gives it (which may give
    more, e.g. what `evaluate` maps predictions back with). A fine-tuning
    spec's batch schema and initial parameters are built from these
    (`albert_jax.finetune.spec`). This default: INPUT_KEYS [T] int32."""
    return {k: ((max_seq_length,), np.int32) for k in INPUT_KEYS}

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

  def describe(self) -> dict[str, Any] | None:
    """What predicting with the fine-tuned model needs, JSON-serialisable:
    "task_type" (a key of `albert_jax.finetune.registry.task_types()`, whose
    `TaskType` reads the rest), "labels" (the label names in class order,
    or None) and the head's and the featurization's settings. None: the
    task cannot be reloaded for prediction (`albert_jax.finetune.serving.fine_tuned`).
    """
    return None


class FineTuneModel(nn.Module):
  """The pre-trained encoder (under "albert") with a task head ("head").

  The encoder's parameters carry the pre-training names, so a checkpoint's
  embeddings/encoder/pooler (and "lm" head) drop into `params["albert"]`
  unchanged.

  Attributes:
    config: the encoder's hyperparameters.
    head: the task head (`Task.head`).
    lm_head: also build a causal model's next-token "lm" head, tied to the
      word embeddings, and return its "lm_logits" (GPT-1's auxiliary
      language-modelling loss).
  """
  config: ModelConfig
  head: nn.Module
  lm_head: bool = False

  @nn.compact
  def __call__(self, batch: dict, deterministic: bool = True) -> dict:
    """batch: INPUT_KEYS [N, T] or [N, C, T] (+ labels; a packed batch also
    "cls_positions" [N, K]) → head outputs, plus
    with `lm_head` "lm_logits" [N(, C), T, V] (position t scoring token
    t + 1)."""
    ids = batch["input_ids"]
    lead, length = ids.shape[:-1], ids.shape[-1]
    flat = {k: batch[k].reshape((-1, length)) for k in INPUT_KEYS}
    # A packed row (`finetune.packing`): its examples' [CLS]es, and their
    # positions counted from each one's start in the model's own way
    # (RoBERTa's from pad_token_id + 1), as each alone in a row. The pooled
    # output is then [N, K, H], one per example.
    packed = {} if packing.CLS not in batch else {
        "cls_positions": batch[packing.CLS],
        "position_ids": encoder_lib.segment_position_ids(
            self.config, flat["attention_mask"])}
    encoded = albert_lib.Albert(self.config, pooler=True,
                            heads=("lm",) if self.lm_head else (),
                            name="albert")(
                                flat["input_ids"], flat["token_type_ids"],
                                flat["attention_mask"],
                                deterministic=deterministic, **packed)
    encoded = {k: v.reshape(lead + v.shape[1:]) for k, v in encoded.items()}
    lm_logits = encoded.pop("lm_logits", None)
    out = self.head(encoded, batch, deterministic)
    if lm_logits is not None:
      out = {**out, "lm_logits": lm_logits}
    return out


def lm_aux_targets(batch: dict) -> tuple[jax.Array, jax.Array]:
  """Next-token targets of a task batch's rows, row weights applied.

  Args:
    batch: INPUT_KEYS [N, T] or [N, C, T] and "weights" [N].

  Returns:
    (labels, weights), each [N·C, T - 1]: `objectives.lm_targets` of every
    row (each choice of a multiple-choice row is one), its weights times the
    row's: only real tokens of one packed sequence predict each other, and
    rows that pad an eval batch predict nothing.
  """
  ids = batch["input_ids"]
  length = ids.shape[-1]
  labels, weights = objectives.lm_targets(
      ids.reshape((-1, length)), batch["attention_mask"].reshape((-1, length)))
  rows = batch["weights"].astype(jnp.float32)
  rows = jnp.broadcast_to(rows.reshape(rows.shape + (1,) * (ids.ndim - 2)),
                          ids.shape[:-1]).reshape(-1)
  return labels, weights * rows[:, None]


def lm_aux_sums(lm_logits: jax.Array, batch: dict) -> dict[str, jax.Array]:
  """The next-token loss on a task batch's input text, in sum form.

  Args:
    lm_logits: [N(, C), T, V], position t scoring token t + 1.
    batch: as for `lm_aux_targets`.

  Returns:
    "lm_loss_sum", "lm_correct" and "lm_count" (the weighted number of
    predicted tokens), as `objectives.lm_sums` gives them in pre-training.
  """
  labels, weights = lm_aux_targets(batch)
  return objectives.lm_sums(
      lm_logits.reshape((-1,) + lm_logits.shape[-2:]), labels, weights)


class TaskObjective:
  """A task as the train step's objective.

  Its loss terms: "task", whose whole-batch denominator is the number of
  real rows, and with `lm_aux_weight` λ > 0 "lm_aux", λ × the next-token
  loss summed over the task rows' real tokens, whose denominator is the
  number of tokens predicted. Each term's sum is divided once by its
  denominator over the whole (accumulated) batch, so accumulation stays
  exact. The metrics keep "loss" the task's and add "lm_loss" and
  "lm_accuracy".
  """

  def __init__(self, model: FineTuneModel, task: Task,
               lm_aux_weight: float = 0.0):
    if lm_aux_weight < 0:
      raise ValueError(f"lm_aux_weight must be >= 0, got {lm_aux_weight}.")
    if lm_aux_weight > 0 and not model.lm_head:
      raise ValueError(
          "lm_aux_weight > 0 needs the model's next-token head; build it "
          "with lm_head=True (`finetune.spec.for_task(..., lm_head=True)`).")
    self.model, self.task = model, task
    self.lm_aux_weight = float(lm_aux_weight)

  def outputs(self, params, batch, rng, deterministic: bool) -> dict:
    return self.model.apply({"params": params}, batch,
                            deterministic=deterministic,
                            rngs=None if deterministic else {"dropout": rng})

  def sums(self, params, batch: dict, rng, deterministic: bool) -> dict:
    outputs = self.outputs(params, batch, rng, deterministic)
    sums = self.task.loss_sums(outputs, batch)
    out = {f"task_{k}": v for k, v in sums.items()}
    out["task_count"] = jnp.sum(packing.example_weights(batch))
    out.update(objectives.padding_sums(batch["attention_mask"]))
    if self.lm_aux_weight > 0:
      lm = lm_aux_sums(outputs["lm_logits"], batch)
      out.update(lm)
      out["lm_aux_loss_sum"] = self.lm_aux_weight * lm["lm_loss_sum"]
    return out

  def denominators(self, batch: dict) -> dict[str, jax.Array]:
    dens = {"task": jnp.maximum(jnp.sum(packing.example_weights(batch)),
                                1.0)}
    if self.lm_aux_weight > 0:
      dens["lm_aux"] = jnp.maximum(jnp.sum(lm_aux_targets(batch)[1]), 1.0)
    return dens

  def metrics(self, sums: dict) -> dict[str, jax.Array]:
    inner = {k[len("task_"):]: v for k, v in sums.items()
             if k.startswith("task_") and k != "task_count"}
    out = dict(self.task.train_metrics(inner, sums["task_count"]))
    out.update(objectives.padding_metrics(sums))
    out["examples"] = sums["task_count"]  # real examples in the batch
    if self.lm_aux_weight > 0:
      count = jnp.maximum(sums["lm_count"], 1.0)
      out["lm_loss"] = sums["lm_loss_sum"] / count
      out["lm_accuracy"] = sums["lm_correct"] / count
    return out
