"""Multiple choice on the user's own files (SWAG-style), beside RACE.

Each row holds a context, optionally a question (or the start of the
ending, SWAG's "sent2"), N candidate endings and the index of the right
one. Choice j is `[CLS] context [SEP] qa_j [SEP]`, qa_j the question with
its "_" blank filled by ending j, or question and ending joined by a space,
or the ending alone without a question; qa_j keeps its last
`max_qa_length` tokens and the context is cut to fit, as RACE
(`albert_jax.finetune.tasks.multiple_choice.choices` holds the featurization, head, loss
and accuracy both share). A softmax over the N choice logits gives the answer; metric
accuracy.

`make_task("choice/files", data)` reads these `config.data` keys:
  train_file, eval_file (required), test_file (optional; its label column
    may be absent): TSV/CSV/JSONL, optionally .gz, local or gs://.
  context_column ("context"), question_column (None: no question).
  choice_columns: the endings' columns, e.g. ("ending0", "ending1",
    "ending2", "ending3"); or choices_column: one JSONL field holding the
    list of endings. Every row has the same number of endings, at least 2.
  label_column ("label"): the right ending's 0-based index.
  max_qa_length (64): question+ending tokens kept.
Predictions: `<split>_predictions.tsv`: row, predicted index (and label).
"""

from __future__ import annotations

import os

import numpy as np

from albert_jax import storage
from albert_jax.finetune import tabular
from albert_jax.finetune.task import Split
from albert_jax.finetune.tasks.multiple_choice import choices

TASKS = ("choice/files",)


class ChoiceFilesTask(choices.MultipleChoiceTask):
  """SWAG-style multiple choice from the user's files; `num_choices` is
  their number of endings."""
  name = "choice/files"
  train_split = "train"
  eval_splits = ("eval",)

  def __init__(self, data):
    get = data.get
    paths = {}
    for split in ("train", "eval", "test"):
      if get(f"{split}_file", None):
        paths[split] = get(f"{split}_file")
      elif split != "test":
        raise ValueError(f"The 'choice/files' task needs data.{split}_file "
                         f"(e.g. '{split}.jsonl').")
    self.context_column = get("context_column", None) or "context"
    self.question_column = get("question_column", None)
    self.label_column = get("label_column", None) or "label"
    columns, field = get("choice_columns", None), get("choices_column", None)
    if bool(columns) == bool(field):
      raise ValueError("Set exactly one of data.choice_columns (('ending0', "
                       "'ending1', ...)) and data.choices_column (a JSONL "
                       "field holding the list of endings).")
    if columns is not None and len(columns) < 2:
      raise ValueError(f"data.choice_columns={list(columns)}: give at least "
                       "two columns.")
    self.choice_columns = tuple(columns) if columns else None
    self.choices_column = field
    self.max_qa_length = get("max_qa_length", 64)
    if (isinstance(self.max_qa_length, bool)
        or not isinstance(self.max_qa_length, int) or self.max_qa_length < 1):
      raise ValueError("data.max_qa_length must be a positive integer, got "
                       f"{self.max_qa_length!r}.")
    self.predict_splits = ("eval",) + (("test",) if "test" in paths else ())
    self._records = {s: self._read(s, p) for s, p in paths.items()}
    counts = {len(r["options"]) for rs in self._records.values() for r in rs}
    if len(counts) != 1:
      raise ValueError(f"The files' rows have different numbers of endings "
                       f"{sorted(counts)}; give every row the same number.")
    (self.num_choices,) = counts

  def _read(self, split: str, path: str) -> list[dict]:
    what = f"data.{split}_file"
    table = tabular.read_table(path, None, what)
    has_labels = split != "test" or self.label_column in table.columns
    out = []
    for row, line in zip(table.rows, table.lines):
      where = f"{what} {table.path}, line {line}"
      if self.choice_columns:
        options = [_field(row, c, where) for c in self.choice_columns]
      else:
        options = _field(row, self.choices_column, where, list)
      if len(options) < 2 or not all(isinstance(o, str) for o in options):
        raise tabular.FileFormatError(
            f"{where}: the endings must be two or more strings, got "
            f"{options!r}.")
      label = -1
      if has_labels:
        value = _field(row, self.label_column, where, (str, int))
        try:
          label = int(value)
        except ValueError:
          label = -1
        if isinstance(value, bool) or not 0 <= label < len(options):
          raise tabular.FileFormatError(
              f"{where}: label {value!r} is not the index of one of its "
              f"{len(options)} endings (0 to {len(options) - 1}).")
      out.append({"article": _field(row, self.context_column, where),
                  "question": (_field(row, self.question_column, where)
                               if self.question_column else ""),
                  "options": options, "label": label})
    return out

  def load(self, split: str, tokenizer, max_seq_length: int) -> Split:
    if split not in self._records:
      raise ValueError(f"choice/files has no split {split!r}; choose one of "
                       f"{tuple(self._records)}.")
    records = self._records[split]
    features = choices.featurize(records, tokenizer,
                                         max_seq_length, self.max_qa_length)
    return Split(name=split, features=features,
                 has_labels=bool(records) and records[0]["label"] >= 0)

  def write_predictions(self, predictions: dict, split: Split,
                        directory: str) -> list[str]:
    labels = split.features["label"] if split.has_labels else None
    lines = ["row\tprediction" + ("\tlabel" if split.has_labels else "")
             + "\n"]
    for i, pred in enumerate(np.asarray(predictions["prediction"])):
      lines.append(f"{i}\t{int(pred)}" + (f"\t{int(labels[i])}"
                                          if split.has_labels else "") + "\n")
    path = storage.path(directory) / f"{split.name}_predictions.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(path, "".join(lines))
    return [os.fspath(path)]

  def describe(self) -> dict:
    return {**super().describe(),
            "context_column": self.context_column,
            "question_column": self.question_column,
            "choice_columns": (list(self.choice_columns)
                               if self.choice_columns else None),
            "choices_column": self.choices_column}


def _field(row: dict, name: str, where: str, kinds=str):
  """row[name], which must exist and be of `kinds`."""
  if name not in row:
    raise tabular.FileFormatError(f"{where}: no column {name!r}; its columns "
                                  f"are {sorted(row)}.")
  value = row[name]
  if not isinstance(value, kinds):
    raise tabular.FileFormatError(f"{where}: {name!r} is {value!r}, not a "
                                  f"{getattr(kinds, '__name__', 'value')}.")
  return value


def make_task(name: str, data) -> ChoiceFilesTask:
  """The user's multiple-choice task; name "choice/files"."""
  if name not in TASKS:
    raise ValueError(f"Unknown task {name!r}; this module defines {TASKS}.")
  return ChoiceFilesTask(data)
