"""Several choices per row: the head and what RACE and choice/files share.

A multiple-choice row holds C choices, choice j being `[CLS] context [SEP]
qa_j [SEP]` where qa_j is the question with its "_" blank filled by option
j, or question and option joined by a space when there is no blank, or the
option alone without a question (SWAG-style endings). qa_j keeps its last
`max_qa_length` tokens and the context is cut to fit the rest, as the
official `race_utils.convert_single_example`. The head scores each choice
from its pooled [CLS] output (dropout, dense → 1); a softmax over the C
choices gives the answer, trained with cross entropy and scored by
accuracy. RACE (`race.py`) and the user's files (`files.py`) differ only
in where rows come from and which files they write (`MultipleChoiceTask`).
The models they fine-tune are `MULTIPLE_CHOICE`: (context, endings) or
(context, question, endings) → {"choice", "answer", "probabilities",
"logits"}.
"""

from __future__ import annotations

import json
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.finetune import task_type as task_type_lib
from albert_jax.finetune.task import INPUT_KEYS
from albert_jax.finetune.task import Split
from albert_jax.finetune.task import Task
from albert_jax.finetune.task_type import PredictError
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives


def qa_text(question: str, option: str) -> str:
  """The official question+option: fill the "_" blank, else append."""
  if "_" in question:
    return question.replace("_", option)
  return " ".join([question, option])


def featurize(records: list[dict], tokenizer, max_seq_length: int,
              max_qa_length: int) -> dict[str, np.ndarray]:
  """Records → "input_ids", "token_type_ids", "attention_mask" [N, C, T]
  int32 and "label" [N] int32.

  Every record has "article", "question" and C "options" (C the same for
  all) and "label" (the answer's index, -1 when unknown). Choice j is
  `[CLS] article [SEP] qa [SEP]`, qa being `qa_text(question, option_j)`,
  or the option alone where the question is empty (SWAG-style endings).
  """
  if tokenizer.cls_id is None or tokenizer.sep_id is None:
    raise ValueError("Multiple-choice inputs need [CLS] and [SEP] pieces; "
                     "this vocabulary has none (train one with "
                     "albert_jax.text.train_tokenizer).")
  if max_seq_length < max_qa_length + 4:
    raise ValueError(
        f"max_seq_length={max_seq_length} leaves no room for the article "
        f"after data.max_qa_length={max_qa_length} question+option tokens "
        "and 3 special tokens; raise max_seq_length or lower "
        "data.max_qa_length.")
  # No rows: any count gives none; RACE's four, as before.
  choices = {len(rec["options"]) for rec in records} or {4}
  if len(choices) != 1:
    raise ValueError(f"The rows have different numbers of choices "
                     f"{sorted(choices)}; featurize rows with the same "
                     "number together.")
  (num_choices,) = choices
  pad = 0 if tokenizer.pad_id is None else tokenizer.pad_id
  n, t = len(records), max_seq_length
  ids = np.full((n, num_choices, t), pad, np.int32)
  types = np.zeros((n, num_choices, t), np.int32)
  mask = np.zeros((n, num_choices, t), np.int32)
  article_ids = {}  # articles carry several questions: tokenize once
  for r, rec in enumerate(records):
    if rec["article"] not in article_ids:
      article_ids = {rec["article"]: tokenizer.encode(rec["article"])}
    article = article_ids[rec["article"]]
    for c, option in enumerate(rec["options"]):
      qa = tokenizer.encode(qa_text(rec["question"], option)
                            if rec["question"] else option)[-max_qa_length:]
      context = article[:t - 3 - len(qa)]
      row = [tokenizer.cls_id] + context + [tokenizer.sep_id] + qa + [
          tokenizer.sep_id]
      ids[r, c, :len(row)] = row
      types[r, c, len(context) + 2:len(row)] = 1
      mask[r, c, :len(row)] = 1
  labels = np.asarray([rec["label"] for rec in records], np.int32)
  return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
          "label": labels.reshape(n)}


class MultipleChoiceHead(nn.Module):
  """pooled [N, C, H] → dropout → dense(1) → a logit per choice [N, C]."""
  config: ModelConfig

  @nn.compact
  def __call__(self, encoded: dict, batch: dict,
               deterministic: bool = True) -> dict:
    del batch  # the choices' inputs are all in `encoded`
    cfg = self.config
    x = nn.Dropout(cfg.classifier_dropout_prob)(
        encoded["pooled_output"], deterministic=deterministic)
    logits = layers.Dense((1,), ("embed", "classes"),
                          **cfg.layer_kwargs, name="output")(x)
    return {"logits": logits[..., 0].astype(jnp.float32)}


class MultipleChoiceTask(Task):
  """A task whose rows are one question with `num_choices` choices.

  Subclasses set `num_choices` and `max_qa_length` and implement loading
  and files; features carry "label" [N] int32, the right choice.
  """
  metric = "accuracy"
  num_choices: int
  max_qa_length: int

  def batch_features(self, max_seq_length: int):
    """INPUT_KEYS [C, T] int32 and "label" [] int32."""
    shape = (self.num_choices, max_seq_length)
    return {**{k: (shape, np.int32) for k in INPUT_KEYS},
            "label": ((), np.int32)}

  def head(self, model_config: ModelConfig) -> nn.Module:
    return MultipleChoiceHead(model_config)

  def loss_sums(self, outputs: dict, batch: dict) -> dict:
    sums = objectives.weighted_cross_entropy(
        outputs["logits"], batch["label"], batch["weights"])
    return {"loss_sum": sums["loss_sum"], "correct_sum": sums["correct"]}

  def predict(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    logits = outputs["logits"]
    return {"logits": logits,
            "prediction": jnp.argmax(logits, axis=-1).astype(jnp.int32)}

  def correct(self, predictions: dict, split: Split) -> np.ndarray:
    """[N] bool: whether each row's predicted choice is its label."""
    return np.asarray(predictions["prediction"]) == split.features["label"]

  def evaluate(self, predictions: dict, split: Split) -> dict[str, float]:
    correct = self.correct(predictions, split)
    return {"accuracy": float(np.mean(correct)) if len(correct) else 0.0}

  def describe(self) -> dict:
    return {"task_type": "multiple_choice", "labels": None,
            "max_qa_length": self.max_qa_length}


def _record(item, settings: dict) -> dict:
  """A multiple-choice input as `featurize`'s record."""
  if isinstance(item, dict):
    context = item.get(settings.get("context_column") or "context",
                       item.get("context"))
    question = item.get(settings.get("question_column") or "question", "")
    choices = item.get("choices")
    if choices is None and settings.get("choice_columns"):
      choices = [item.get(c) for c in settings["choice_columns"]]
    if choices is None and settings.get("choices_column"):
      choices = item.get(settings["choices_column"])
  elif isinstance(item, tuple) and len(item) in (2, 3):
    context, question, choices = (item[0], "", item[1]) if len(item) == 2 \
        else item
  else:
    context = question = choices = None
  if (not isinstance(context, str) or not isinstance(question or "", str)
      or not isinstance(choices, (list, tuple)) or len(choices) < 2
      or not all(isinstance(c, str) for c in choices)):
    raise PredictError(
        "A multiple-choice input is (context, [choice, ...]), (context, "
        "question, [choice, ...]) or a dict with 'context', 'choices' and "
        f"optionally 'question'; two or more choices. Got {item!r}.")
  return {"article": context, "question": question or "",
          "options": list(choices), "label": -1}


class MultipleChoiceType(task_type_lib.TaskType):
  """A fine-tuned multiple-choice model: `MultipleChoiceHead` on C choices.

  Its task.json: "max_qa_length" and, from choice/files, the columns it
  was trained on ("context_column", "question_column", "choice_columns" or
  "choices_column").
  """
  name = "multiple_choice"
  hf_class = "ForMultipleChoice"

  def head(self, info: dict, cfg: ModelConfig) -> nn.Module:
    return MultipleChoiceHead(cfg)

  def features(self, max_seq_length: int):
    """INPUT_KEYS [2, T]: the parameters do not depend on how many
    choices."""
    return {k: ((2, max_seq_length), np.int32) for k in INPUT_KEYS}

  def predict(self, model, items: list, batch_size: int) -> list[dict]:
    records = [_record(item, model.settings) for item in items]
    out: list[dict | None] = [None] * len(records)
    # Rows with the same number of choices share one [N, C, T] array.
    by_count: dict[int, list[int]] = {}
    for i, rec in enumerate(records):
      by_count.setdefault(len(rec["options"]), []).append(i)
    for indices in by_count.values():
      features = featurize(
          [records[i] for i in indices], model.tokenizer,
          model.max_seq_length, model.settings.get("max_qa_length", 128))
      logits = model(features, batch_size)["logits"].astype(np.float64)
      for i, row, p in zip(indices, logits, task_type_lib.softmax(logits)):
        k = int(np.argmax(row))
        out[i] = {"choice": k, "answer": records[i]["options"][k],
                  "probabilities": [float(x) for x in p],
                  "logits": [float(x) for x in row]}
    return out

  def file_input(self, row: dict, settings: dict,
                 columns: Sequence[str] | None):
    """The context and the endings from `columns` (context first), else
    the row, its "choices" decoded where a CSV/TSV holds them as JSON."""
    if columns:
      return {"context": row.get(columns[0]),
              "choices": [row.get(c) for c in columns[1:]]}
    if isinstance(row.get("choices"), str):
      try:
        return {**row, "choices": json.loads(row["choices"])}
      except json.JSONDecodeError as e:
        raise PredictError(str(e)) from None
    return row

  def imported_settings(self) -> dict:
    return {"max_qa_length": 64}


MULTIPLE_CHOICE = MultipleChoiceType()
