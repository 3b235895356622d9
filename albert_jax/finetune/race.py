"""RACE reading comprehension as 4-way multiple choice, as ALBERT's run_race.

Each article holds several questions; every question is one row of 4
choices, choice j being `[CLS] article [SEP] question+option_j [SEP]` where
question+option is the question with its "_" blank filled by the option, or
question and option joined by a space when there is no blank. The
question+option keeps its last `max_qa_length` tokens and the article is cut
to fit the rest, as the official `race_utils.convert_single_example`. The
head scores each choice from its pooled [CLS] output (dropout, dense → 1);
a softmax over the 4 choices gives the answer.

`make_task("race/high" | "race/middle" | "race/all", data)` reads these
`config.data` keys:
  tfds_data_dir (None): TFDS data directory, local or gs:// (None:
    TFDS's default).
  tfds_download (True): let TFDS download and prepare a missing dataset.
  max_qa_length (128): question+option tokens kept.
"race/all" reads both levels (middle, then high, as the official reader) and
reports accuracy over all questions ("accuracy", also as "accuracy_all")
and per level ("accuracy_high", "accuracy_middle"). Dev is evaluated during
training and selects the checkpoint; dev and test (labelled too) get
`<split>_predictions.tsv`: question id, level, predicted and gold letter.
"""

from __future__ import annotations

import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import storage
from albert_jax.finetune.task import INPUT_KEYS
from albert_jax.finetune.task import Split
from albert_jax.finetune.task import Task
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives

TASKS = ("race/high", "race/middle", "race/all")
LETTERS = "ABCD"
NUM_CHOICES = len(LETTERS)


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _as_list(value) -> list:
  """A TFDS sequence (numpy array, ragged tensor or list) as a list."""
  if hasattr(value, "to_list"):
    return value.to_list()
  return value.tolist() if hasattr(value, "tolist") else list(value)


def read_tfds(level: str, split: str, data_dir=None,
              download: bool = True) -> list[dict]:
  """One record per question of TFDS `race/{level}`.

  Records: "id" (`{example_id}-{question index}`), "level", "article",
  "question", "options" (4 strings) and "label" (0-3).

  Raises:
    ValueError: a question without exactly 4 options or with an answer that
      is not one of A-D (names the example).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(f"race/{level}", data_dir=data_dir)
  if download:
    builder.download_and_prepare()
  ds = builder.as_dataset(split=split, shuffle_files=False)
  out = []
  for ex in tfds.as_numpy(ds):
    example_id = _text(ex["example_id"])
    questions = [_text(q) for q in _as_list(ex["questions"])]
    answers = [_text(a) for a in _as_list(ex["answers"])]
    options = [[_text(o) for o in opts] for opts in _as_list(ex["options"])]
    if not len(questions) == len(answers) == len(options):
      raise ValueError(
          f"RACE example {example_id!r} has {len(questions)} questions, "
          f"{len(answers)} answers and {len(options)} option lists; they "
          "must match.")
    for i, (question, answer, opts) in enumerate(
        zip(questions, answers, options)):
      if len(opts) != NUM_CHOICES or answer not in tuple(LETTERS):
        raise ValueError(
            f"RACE example {example_id!r} question {i}: expected "
            f"{NUM_CHOICES} options and an answer in {LETTERS}, got "
            f"{len(opts)} options and answer {answer!r}.")
      out.append({"id": f"{example_id}-{i}", "level": level,
                  "article": _text(ex["article"]), "question": question,
                  "options": opts, "label": LETTERS.index(answer)})
  return out


def qa_text(question: str, option: str) -> str:
  """The official question+option: fill the "_" blank, else append."""
  if "_" in question:
    return question.replace("_", option)
  return " ".join([question, option])


def choice_features(num_choices: int, max_seq_length: int):
  """A multiple-choice row's features (`Task.batch_features`): INPUT_KEYS
  [C, T] int32 and "label" [] int32."""
  shape = (num_choices, max_seq_length)
  return {**{k: (shape, np.int32) for k in INPUT_KEYS},
          "label": ((), np.int32)}


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
                     "albert_jax.text.train).")
  if max_seq_length < max_qa_length + 4:
    raise ValueError(
        f"max_seq_length={max_seq_length} leaves no room for the article "
        f"after data.max_qa_length={max_qa_length} question+option tokens "
        "and 3 special tokens; raise max_seq_length or lower "
        "data.max_qa_length.")
  choices = {len(rec["options"]) for rec in records} or {NUM_CHOICES}
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


class RaceTask(Task):
  """RACE: accuracy over questions (and per level for "race/all")."""
  metric = "accuracy"
  train_split = "train"
  eval_splits = ("dev",)
  predict_splits = ("dev", "test")

  def __init__(self, name: str, data):
    if name not in TASKS:
      raise ValueError(f"Unknown RACE task {name!r}; choose one of {TASKS}.")
    self.name = name
    self.levels = (("middle", "high") if name == "race/all" else
                   (name.split("/")[1],))
    data_dir = data.get("tfds_data_dir", None)
    self.data_dir = storage.as_str(data_dir) if data_dir else None
    self.download = bool(data.get("tfds_download", True))
    self.max_qa_length = data.get("max_qa_length", 128)
    if not isinstance(self.max_qa_length, int) or self.max_qa_length < 1:
      raise ValueError("data.max_qa_length must be a positive integer, got "
                       f"{self.max_qa_length!r}.")

  def load(self, split: str, tokenizer, max_seq_length: int) -> Split:
    records = [r for level in self.levels
               for r in read_tfds(level, split, self.data_dir, self.download)]
    if not records:
      raise ValueError(f"TFDS {self.name} split {split!r} is empty.")
    features = featurize(records, tokenizer, max_seq_length,
                         self.max_qa_length)
    examples = {"ids": [r["id"] for r in records],
                "levels": np.asarray([r["level"] for r in records]),
                "labels": features["label"]}
    return Split(name=split, features=features, examples=examples)

  def batch_features(self, max_seq_length: int):
    return choice_features(NUM_CHOICES, max_seq_length)

  def head(self, model_config):
    return MultipleChoiceHead(model_config)

  def loss_sums(self, outputs: dict, batch: dict) -> dict:
    sums = objectives.weighted_cross_entropy(
        outputs["logits"], batch["label"], batch["weights"])
    return {"loss_sum": sums["loss_sum"], "correct_sum": sums["correct"]}

  def predict(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    logits = outputs["logits"]
    return {"logits": logits,
            "prediction": jnp.argmax(logits, axis=-1).astype(jnp.int32)}

  def describe(self) -> dict:
    return {"task_type": "multiple_choice", "labels": None,
            "max_qa_length": self.max_qa_length}

  def evaluate(self, predictions: dict, split: Split) -> dict[str, float]:
    ex = split.examples
    correct = np.asarray(predictions["prediction"]) == ex["labels"]
    out = {"accuracy": float(np.mean(correct)) if len(correct) else 0.0}
    if len(self.levels) > 1:
      out["accuracy_all"] = out["accuracy"]
      for level in self.levels:
        mine = ex["levels"] == level
        out[f"accuracy_{level}"] = (float(np.mean(correct[mine]))
                                    if mine.any() else 0.0)
    return out

  def write_predictions(self, predictions: dict, split: Split,
                        directory: str) -> list[str]:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", split.name)
    path = storage.path(directory) / f"{safe}_predictions.tsv"
    ex = split.examples
    lines = ["id\tlevel\tprediction\tlabel\n"] + [
        f"{qid}\t{level}\t{LETTERS[int(pred)]}\t{LETTERS[int(label)]}\n"
        for qid, level, pred, label in zip(ex["ids"], ex["levels"],
                                           predictions["prediction"],
                                           ex["labels"])]
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(path, "".join(lines))
    return [os.fspath(path)]


def make_task(name: str, data) -> RaceTask:
  """The RACE task `name` ("race/high", "race/middle" or "race/all")."""
  return RaceTask(name, data)
