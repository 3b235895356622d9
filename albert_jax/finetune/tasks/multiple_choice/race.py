"""RACE reading comprehension as 4-way multiple choice, as ALBERT's run_race.

Each article holds several questions; every question is one row of 4
choices, choice j being `[CLS] article [SEP] question+option_j [SEP]` where
question+option is the question with its "_" blank filled by the option, or
question and option joined by a space when there is no blank. The
featurization, head, loss and accuracy are those of
`albert_jax.finetune.tasks.multiple_choice.choices`, which choice/files shares.

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

import numpy as np

from albert_jax import storage
from albert_jax.finetune.task import Split
from albert_jax.finetune.tasks.multiple_choice import choices
from albert_jax.finetune.tfds_source import TfdsSource

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


def read_tfds(level: str, split: str, source: TfdsSource) -> list[dict]:
  """One record per question of TFDS `race/{level}`, read from `source`.

  Records: "id" (`{example_id}-{question index}`), "level", "article",
  "question", "options" (4 strings) and "label" (0-3).

  Raises:
    ValueError: a question without exactly 4 options or with an answer that
      is not one of A-D (names the example).
  """
  out = []
  for ex in source.examples(f"race/{level}", split):
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


class RaceTask(choices.MultipleChoiceTask):
  """RACE: accuracy over questions (and per level for "race/all")."""
  num_choices = NUM_CHOICES
  train_split = "train"
  eval_splits = ("dev",)
  predict_splits = ("dev", "test")

  def __init__(self, name: str, data):
    if name not in TASKS:
      raise ValueError(f"Unknown RACE task {name!r}; choose one of {TASKS}.")
    self.name = name
    self.levels = (("middle", "high") if name == "race/all" else
                   (name.split("/")[1],))
    self.source = TfdsSource.from_data(data)
    self.max_qa_length = data.get("max_qa_length", 128)
    if not isinstance(self.max_qa_length, int) or self.max_qa_length < 1:
      raise ValueError("data.max_qa_length must be a positive integer, got "
                       f"{self.max_qa_length!r}.")

  def load(self, split: str, tokenizer, max_seq_length: int) -> Split:
    records = [r for level in self.levels
               for r in read_tfds(level, split, self.source)]
    if not records:
      raise ValueError(f"TFDS {self.name} split {split!r} is empty.")
    features = choices.featurize(records, tokenizer,
                                         max_seq_length, self.max_qa_length)
    examples = {"ids": [r["id"] for r in records],
                "levels": np.asarray([r["level"] for r in records]),
                "labels": features["label"]}
    return Split(name=split, features=features, examples=examples)

  def evaluate(self, predictions: dict, split: Split) -> dict[str, float]:
    ex = split.examples
    correct = self.correct(predictions, split)
    out = super().evaluate(predictions, split)
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
