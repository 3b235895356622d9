"""One label per row: the classification/regression head and what it shares.

GLUE (`glue.py`) and the user's own files (`files.py`) differ only in
where rows come from, how they are scored and which files they write. The
head, its losses, the per-row predictions and the `[CLS] a [SEP] b [SEP]`
featurization are the same and live here, as do the task types of the
models they fine-tune (`CLASSIFICATION`, `REGRESSION`): a text or a
(text, text) pair → {"label", "probability", "probabilities", "logits"} or
{"score"}.

The head follows the official `run_classifier.py`: dropout on the pooled
[CLS] output, then one dense layer to the logits (one output for
regression). Its dropout rate is `ModelConfig.classifier_dropout_prob`
(HF's name; 0.1, the value the official script hard-codes), separate from
`hidden_dropout_prob`, which the v2 models set to 0.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.finetune import packing
from albert_jax.finetune import task as task_lib
from albert_jax.finetune import task_type as task_type_lib
from albert_jax.finetune.task_type import PredictError
from albert_jax.interop import hf_task_heads
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives

log = logging.getLogger(__name__)


class ClassifierHead(nn.Module):
  """Dropout → dense on the pooled output.

  Attributes:
    config: the encoder's config (initializer range, dtypes, dropout).
    num_outputs: classes, or 1 for regression.
  """
  config: ModelConfig
  num_outputs: int

  @nn.compact
  def __call__(self, encoded: dict, batch: dict,
               deterministic: bool) -> dict[str, jax.Array]:
    """encoded["pooled_output"] [N, H] → {"logits": [N, num_outputs] f32}."""
    del batch  # the labels are the loss's business, not the head's
    cfg = self.config
    x = nn.Dropout(cfg.classifier_dropout_prob)(
        encoded["pooled_output"], deterministic=deterministic)
    logits = layers.Dense(
        (self.num_outputs,), ("embed", "classes"),
        **cfg.layer_kwargs, name="classifier")(x)
    return {"logits": logits.astype(jnp.float32)}


def squared_error_sums(predictions: jax.Array, labels: jax.Array,
                       weights: jax.Array) -> dict[str, jax.Array]:
  """Weighted sum of squared errors (the official STS-B loss, in sum form).

  Args:
    predictions: [N] float.
    labels: [N] float.
    weights: [N] float, 0 for padding rows.
  """
  err = jnp.square(predictions.astype(jnp.float32) -
                   labels.astype(jnp.float32))
  weights = weights.astype(jnp.float32)
  return {"loss_sum": jnp.sum(jnp.where(weights > 0, err, 0.0) * weights)}


class SingleLabelTask(task_lib.Task):
  """A task with one label per row: classification or regression.

  Subclasses set `num_labels` (ignored for regression) and `regression`
  and implement loading, scoring and files; features carry "labels" [N]
  (int32 class ids, or float32 targets for regression).
  """
  num_labels: int = 2
  regression: bool = False
  packable = True  # one [CLS] → one label per example

  def batch_features(self, max_seq_length: int):
    """INPUT_KEYS [T] and "labels" [] (float32 for regression)."""
    return {**super().batch_features(max_seq_length),
            "labels": ((), np.float32 if self.regression else np.int32)}

  def head(self, model_config: ModelConfig) -> nn.Module:
    return ClassifierHead(model_config,
                          1 if self.regression else self.num_labels)

  def loss_sums(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    weights = packing.example_weights(batch)
    if self.regression:
      return squared_error_sums(outputs["logits"][..., 0], batch["labels"],
                                weights)
    sums = objectives.weighted_cross_entropy(
        outputs["logits"], batch["labels"], weights)
    return {"loss_sum": sums["loss_sum"], "correct_sum": sums["correct"]}

  def label_names(self) -> tuple[str, ...]:
    """The classes' names in class-id order (default "0", "1", ...)."""
    return tuple(str(i) for i in range(self.num_labels))

  def text_names(self) -> tuple[str, ...]:
    """What the one or two texts of a row are called (columns, features)."""
    return ("text",)

  def describe(self) -> dict:
    return {"task_type": "regression" if self.regression else
                         "classification",
            "labels": None if self.regression else list(self.label_names()),
            "text_columns": list(self.text_names())}

  def predict(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    """{"prediction": [N] ([N, K] packed)}: the class id (int32) or the
    regression value."""
    del batch
    if self.regression:
      return {"prediction": outputs["logits"][..., 0]}
    return {"prediction": jnp.argmax(outputs["logits"], axis=-1).astype(
        jnp.int32)}


def row_predictions(predictions: dict, split: task_lib.Split) -> np.ndarray:
  """predictions["prediction"] as a host array, checked against the split."""
  if "prediction" not in predictions:
    raise ValueError(f"No 'prediction' among the predictions of split "
                     f"{split.name!r} (got {sorted(predictions)}).")
  pred = np.asarray(predictions["prediction"])
  if pred.shape != (split.num_rows,):
    raise ValueError(
        f"Split {split.name!r} has {split.num_rows} rows but the predictions "
        f"have shape {pred.shape}; pass one prediction per row, in row order, "
        "with the padding rows removed.")
  return pred


def encode_texts(tokenizer, texts_a: Sequence[str],
                 texts_b: Optional[Sequence[str]],
                 max_seq_length: int) -> dict[str, np.ndarray]:
  """`[CLS] a [SEP] (b [SEP])` for every row, padded to one length.

  Args:
    tokenizer: an `albert_jax.text.tokenizer.Tokenizer`.
    texts_a: N first texts.
    texts_b: N second texts, or None for single-sentence tasks.
    max_seq_length: T; longer pairs are cut longest-first (HF's rule).

  Returns:
    "input_ids", "token_type_ids", "attention_mask": int32 [N, T]; padding
    positions hold `tokenizer.pad_id`, type 0 and mask 0.
  """
  if tokenizer.pad_id is None:
    raise ValueError(f"The tokenizer ({tokenizer.path or 'in memory'}) has "
                     "no <pad>/[PAD] piece to pad rows with; use an "
                     "ALBERT/BERT vocabulary.")
  if texts_b is not None and len(texts_b) != len(texts_a):
    raise ValueError(f"{len(texts_a)} first texts but {len(texts_b)} second "
                     "texts.")
  n = len(texts_a)
  out = {"input_ids": np.full((n, max_seq_length), tokenizer.pad_id,
                              np.int32),
         "token_type_ids": np.zeros((n, max_seq_length), np.int32),
         "attention_mask": np.zeros((n, max_seq_length), np.int32)}
  full = 0
  for i in range(n):
    enc = tokenizer.encode_pair(texts_a[i],
                                None if texts_b is None else texts_b[i],
                                max_seq_length)
    length = len(enc["input_ids"])
    full += length == max_seq_length
    for key in out:
      out[key][i, :length] = enc[key]
  if full:
    # Most such rows were cut; a large share suggests a longer max_seq_length.
    log.info("%d of %d rows fill all %d positions (texts truncated "
             "longest-first).", full, n, max_seq_length)
  return out


def _texts(item, columns: Sequence[str]) -> tuple[str, str | None]:
  """(text, second text or None) of a classification input."""
  if isinstance(item, str):
    return item, None
  if isinstance(item, dict):
    missing = [c for c in columns if c not in item]
    if missing:
      raise PredictError(f"Input {item!r} lacks {missing}; this model reads "
                         f"{list(columns)}.")
    values = [item[c] for c in columns]
  else:
    values = list(item) if isinstance(item, tuple) else None
  if (not values or len(values) > 2
      or not all(isinstance(v, str) for v in values)):
    raise PredictError(
        f"A classification input is a text, a (text, text) pair or a dict "
        f"with {list(columns)}; got {item!r}.")
  return values[0], values[1] if len(values) > 1 else None


class SingleLabelType(task_type_lib.TaskType):
  """A fine-tuned classifier (or regressor) of texts or text pairs.

  Its task.json: "labels" (the class names; None for regression) and
  "text_columns" (the one or two texts' names; None for a transformers
  checkpoint, which takes texts and pairs).
  """

  def __init__(self, regression: bool):
    self.regression = regression
    self.name = "regression" if regression else "classification"
    self.labelled = not regression
    self.problem_type = ("regression" if regression
                         else "single_label_classification")
    self.packable = True  # one [CLS] → one output per input
    self.hf_class = "ForSequenceClassification"

  def reads_hf(self, hf_config: dict) -> bool:
    # One class for both; transformers tells them by problem_type.
    return (hf_config.get("problem_type") == "regression") == self.regression

  def head(self, info: dict, cfg: ModelConfig) -> nn.Module:
    return ClassifierHead(cfg,
                          1 if self.regression else len(info["labels"]))

  def predict(self, model, items: list, batch_size: int) -> list[dict]:
    recorded = model.settings.get("text_columns")
    columns = recorded or ["text", "text_pair"]
    pairs = [_texts(item, columns) for item in items]
    has_b = {b is not None for _, b in pairs}
    if len(has_b) > 1:
      raise PredictError("Some inputs are pairs and some single texts; "
                         "predict them in separate calls.")
    want_pair = len(columns) == 2 if recorded else has_b == {True}
    if has_b != {want_pair}:
      raise PredictError(
          "This model was fine-tuned on "
          + ("text pairs; give (text, text) pairs." if want_pair
             else "single texts; give one text per input."))
    features = encode_texts(
        model.tokenizer, [a for a, _ in pairs],
        [b for _, b in pairs] if want_pair else None, model.max_seq_length)
    logits = model(features, batch_size)["logits"].astype(np.float64)
    if self.regression:
      return [{"score": float(row[0])} for row in logits]
    out = []
    for p, row in zip(task_type_lib.softmax(logits), logits):
      k = int(np.argmax(row))
      out.append({"label": model.labels[k], "probability": float(p[k]),
                  "probabilities": dict(zip(model.labels, map(float, p))),
                  "logits": [float(x) for x in row]})
    return out

  def file_input(self, row: dict, settings: dict,
                 columns: Sequence[str] | None):
    """The row's text, or (text, text) pair, from `columns` (default the
    trained text columns)."""
    names = list(columns or settings.get("text_columns") or ["text"])
    missing = [c for c in names if c not in row]
    if missing:
      raise PredictError(f"no column {missing[0]!r} (columns: "
                         f"{sorted(row)}); name the text columns with "
                         "--columns.")
    values = [row[c] for c in names]
    return values[0] if len(values) == 1 else tuple(values)

  def hf_pooler(self, model_type: str) -> bool:
    # RoBERTa's sequence classifier has no pooler: its head computes it.
    return model_type != "roberta"

  def head_to_hf(self, params: dict, model_type: str
                 ) -> dict[str, np.ndarray]:
    head = params["head"]["classifier"]
    if model_type == "roberta":
      return {**hf_task_heads.linear("classifier.dense",
                                     params["albert"]["pooler"]),
              **hf_task_heads.linear("classifier.out_proj", head)}
    return hf_task_heads.linear("classifier", head)

  def head_from_hf(self, state: dict[str, np.ndarray],
                   model_type: str) -> dict:
    if model_type != "roberta":
      return {"classifier": hf_task_heads.take(state, "classifier")}
    # RoBERTa's classifier.dense is our pooler: handed to the encoder's.
    pooler = hf_task_heads.take(state, "classifier.dense")
    state[f"{model_type}.pooler.dense.weight"] = pooler["kernel"].T
    state[f"{model_type}.pooler.dense.bias"] = pooler["bias"]
    return {"classifier": hf_task_heads.take(state, "classifier.out_proj")}

  def hf_labels(self, labels: Sequence[str] | None) -> list[str] | None:
    # transformers names a regressor's one output too.
    return ["LABEL_0"] if self.regression else super().hf_labels(labels)

  def imported_settings(self) -> dict:
    return {"text_columns": None}


CLASSIFICATION = SingleLabelType(regression=False)
REGRESSION = SingleLabelType(regression=True)
