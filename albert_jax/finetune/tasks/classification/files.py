"""The user's own classification or regression task, from TSV, CSV or JSONL.

`make_task("files", data)` reads every file at once, so a wrong path, column
or label fails before any model is built, with the file, the line and the
fix. Formats (TSV, CSV, JSONL, optionally gzipped) are read by
`albert_jax.finetune.tabular`.

Files are local paths (`~` expanded) or `gs://BUCKET/...`.

Splits: "train", "eval" (evaluated during training; selects the best
checkpoint) and, with `test_file`, "test". Predictions are written for
"eval" and "test" as `<split>_predictions.tsv`: row index, prediction (the
label string, or the value) and, when the file has labels, the gold label.
A test file may lack the label column; it is then only predicted.

Metrics: accuracy, plus F1 of the second label with two labels or macro F1
with more; Pearson, Spearman, their mean and MSE for regression.

`data` keys read:
  train_file, eval_file: paths (required).
  test_file: path (default None: no test split).
  text_column: the text's column, or
  text_columns: a list of one or two columns (two: sentence pairs).
  label_column: the label's column (required).
  labels: the label set in order (default: the train file's distinct labels,
    sorted, numerically when they are all integers); class i is labels[i].
  task_type: "classification" (default) or "regression".
  header: column names by position, for TSV/CSV files without a header row
    (default None: the first row is the header).
  metric: the checkpoint-selection metric (default "accuracy", or "pearson"
    for regression); any higher-is-better key `evaluate` reports.

Labels are checked where they are read, as accidents in the data would
train the wrong classes: surrounding whitespace is stripped (with a warning
counting the labels it changed); one number's spellings ("1", "1.0") are
one class (with a warning); empty and null labels are refused by line;
labels that differ only in case ("spam", "Spam") are refused with their
rows; so is a train file of one label, and an eval or test row whose label
the train file never has. The label set, with each label's training rows,
is logged. A misspelt column, task_type or metric is refused with the
closest valid name; so is a label column that is also a text column. An
eval file holding the train file's rows is warned of.

`tables.split_file` cuts one labelled file into stratified train/eval/test
files.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import logging
import math
import os
from typing import Optional

import numpy as np

from albert_jax import hints
from albert_jax import storage
from albert_jax.finetune import tabular
from albert_jax.finetune import task as task_lib
from albert_jax.finetune.tabular import column
from albert_jax.finetune.tabular import FileFormatError
from albert_jax.finetune.tabular import label_key
from albert_jax.finetune.tabular import read_table
from albert_jax.finetune.tabular import sorted_labels
from albert_jax.finetune.tabular import Table
from albert_jax.finetune.tasks.classification import official_metrics as task_metrics
from albert_jax.finetune.tasks.classification import single_label

log = logging.getLogger(__name__)

TASKS = ("files",)
TASK_TYPES = ("classification", "regression")


def _metric_names(regression: bool, num_labels: int) -> tuple[str, ...]:
  """The higher-is-better keys `evaluate` reports."""
  if regression:
    return ("pearson", "spearman", "pearson_spearman_mean")
  return ("accuracy", "f1" if num_labels == 2 else "macro_f1")


@dataclasses.dataclass(frozen=True)
class Rows:
  """Per-row bookkeeping of a loaded split.

  Attributes:
    index: [N] each row's 0-based index among its file's data rows.
    gold: the gold labels as written in the file, or None (unlabelled).
  """
  index: np.ndarray
  gold: Optional[list[str]]


class FilesTask(single_label.SingleLabelTask):
  """A task defined by the user's files (see the module docstring)."""
  name = "files"

  def __init__(self, data):
    def required(key, example):
      if not data.get(key, None):
        raise ValueError(f"The 'files' task needs data.{key} (e.g. "
                         f"{example}).")
      return data.get(key)
    paths = {"train": required("train_file", "'train.tsv'"),
             "eval": required("eval_file", "'eval.tsv'")}
    if data.get("test_file", None):
      paths["test"] = data.get("test_file")
    self.label_column = required("label_column", "'label'")
    text, texts = data.get("text_column", None), data.get("text_columns", None)
    if bool(text) == bool(texts):
      raise ValueError("Set exactly one of data.text_column ('text') and "
                       "data.text_columns (['question', 'passage']).")
    self.text_columns = (text,) if text else tuple(texts)
    if not 1 <= len(self.text_columns) <= 2 or not all(
        isinstance(c, str) for c in self.text_columns):
      raise ValueError(f"data.text_columns={list(self.text_columns)}: give "
                       "one or two column names.")
    if self.label_column in self.text_columns:
      raise ValueError(
          f"data.label_column={self.label_column!r} is also a text column "
          f"(data.{'text_column' if text else 'text_columns'}); the model "
          "would read the answer in its input. Name the text's own "
          "column(s) there.")
    task_type = data.get("task_type", "classification")
    if task_type not in TASK_TYPES:
      raise ValueError(f"data.task_type={task_type!r}"
                       f"{hints.did_you_mean(str(task_type), TASK_TYPES)}; "
                       f"choose one of {TASK_TYPES}.")
    self.regression = task_type == "regression"
    header = data.get("header", None)
    self._tables = {
        split: read_table(path, None if header is None else list(header),
                          f"data.{split}_file")
        for split, path in paths.items()}
    for split, table in self._tables.items():
      for name in self.text_columns:
        self._texts(table, name, split)  # fail now, not at load time
    _warn_if_eval_is_train(self._tables["train"], self._tables["eval"])
    # Each labelled split's label keys, surrounding whitespace stripped,
    # empty and null ones refused, a number's spellings made one.
    self._keys = {} if self.regression else {
        split: tabular.label_keys(
            column(table, self.label_column, f"data.{split}_file",
                   "data.label_column"), f"data.{split}_file {table.path}",
            table.lines)
        for split, table in self._tables.items()
        if split != "test" or self.label_column in table.columns}
    given = data.get("labels", None)
    self._spelling = tabular.one_spelling_per_number(
        {f"data.{split}_file {self._tables[split].path}": keys
         for split, keys in self._keys.items()}
        | ({} if given is None else
           {"data.labels": [label_key(v) for v in given]}))
    self._keys = {split: [self._spelling.get(k, k) for k in keys]
                  for split, keys in self._keys.items()}
    self.labels = None if self.regression else self._label_set(data)
    self.num_labels = 1 if self.regression else len(self.labels)
    self._targets = {split: self._read_targets(split, table)
                     for split, table in self._tables.items()}
    allowed = _metric_names(self.regression, self.num_labels)
    self.metric = data.get("metric", None) or allowed[0]
    if self.metric not in allowed:
      raise ValueError(f"data.metric={self.metric!r}"
                       f"{hints.did_you_mean(str(self.metric), allowed)}; this "
                       f"task reports {allowed} (higher is better).")
    self.eval_splits = ("eval",)
    self.predict_splits = ("eval",) + (("test",) if "test" in paths else ())

  def label_names(self) -> tuple[str, ...]:
    return tuple(self.labels)

  def text_names(self) -> tuple[str, ...]:
    return tuple(self.text_columns)

  def _label_set(self, data) -> tuple[str, ...]:
    """data.labels, or the train file's labels; at least two, distinct.

    The train file must hold rows of two labels or more, none differing
    from another only in case; its label set with each label's rows is
    logged.
    """
    train = self._tables["train"]
    where = f"data.train_file {train.path}"
    counts = collections.Counter(k for k in self._keys["train"] if k != "")
    tabular.check_case_variants(counts, where)
    if len(counts) == 1:
      (only, rows), = counts.items()
      raise FileFormatError(
          f"{where} holds only the label {only!r} ({rows} rows); a "
          "classifier learns from rows of two labels or more. Add rows of "
          "the other labels (or, for a numeric target, set "
          "data.task_type='regression').")
    given = data.get("labels", None)
    if given is not None:
      labels = [label_key(v) for v in given]
      labels = [self._spelling.get(k, k) for k in labels]
      where = "data.labels"
      folded = collections.Counter(k.casefold() for k in labels)
      clash = [k for k in labels if folded[k.casefold()] > 1]
      if len(set(clash)) > 1:
        raise ValueError(f"data.labels lists {clash}, which differ only in "
                         "case; list each label once, as the data writes "
                         "it.")
    else:
      labels = sorted_labels(counts)
      where = f"the labels of {where}"
    if len(labels) < 2 or len(set(labels)) != len(labels):
      raise ValueError(f"{where} give the label set {labels}; classification "
                       "needs at least two distinct labels (or set "
                       "data.task_type='regression').")
    log.info("data.train_file %s: %d labels, %s.", train.path, len(labels),
             ", ".join(f"{k} ({counts[k]} rows)" for k in labels))
    unused = [k for k in labels if not counts[k]]
    if unused:
      log.warning("data.labels %s have no rows in data.train_file %s; the "
                  "model will never predict them.", unused, train.path)
    return tuple(labels)

  def _texts(self, table: Table, name: str, split: str) -> list[str]:
    values = column(table, name, f"data.{split}_file")
    for value, line in zip(values, table.lines):
      if not isinstance(value, str):
        raise FileFormatError(f"data.{split}_file {table.path}, line {line}: "
                              f"{name!r} is {value!r}, not a string.")
    return values

  def _read_targets(self, split: str, table: Table) -> Optional[tuple]:
    """(labels [N] int32 class ids or float32 values, gold strings), or None
    for a test file without the label column.

    A class must occur in the train file: an eval or test row whose label
    does not is refused, as the model cannot learn it.
    """
    what = f"data.{split}_file"
    if split == "test" and self.label_column not in table.columns:
      return None
    values = column(table, self.label_column, what, "data.label_column")
    if self.regression:
      out = np.zeros(len(values), np.float32)
      for i, (value, line) in enumerate(zip(values, table.lines)):
        try:
          out[i] = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
          out[i] = math.nan
        if not math.isfinite(out[i]):
          raise FileFormatError(f"{what} {table.path}, line {line}: label "
                                f"{value!r} is not a finite number, as "
                                "regression needs.")
      return out, [label_key(v) for v in values]
    keys = self._keys[split]
    trained = set(self._keys["train"])
    index = {k: i for i, k in enumerate(self.labels)}
    out = np.zeros(len(values), np.int32)
    for i, (key, line) in enumerate(zip(keys, table.lines)):
      where = f"{what} {table.path}, line {line}"
      if split != "train" and key not in trained:
        train = self._tables["train"].path
        raise FileFormatError(
            f"{where} (row {i}): label {key!r} does not occur in "
            f"data.train_file {train}"
            f"{hints.did_you_mean(key, sorted(trained - {''}))}; the model "
            "cannot learn a label it never sees. Correct the label, or add "
            "training rows with it.")
      if key not in index:
        raise FileFormatError(f"{where}: label {key!r} is not in the label "
                              f"set {list(self.labels)}; list every label in "
                              "data.labels.")
      out[i] = index[key]
    return out, keys

  def load(self, split: str, tokenizer, max_seq_length: int) -> task_lib.Split:
    """Featurizes a split read at construction.

    Returns:
      A Split with INPUT_KEYS int32 [N, max_seq_length], "labels" [N] (int32
      class ids, float32 for regression; -1 / NaN when unlabelled) and
      `Rows` examples.
    """
    if split not in self._tables:
      raise ValueError(f"The files task has no split {split!r}; choose one "
                       f"of {tuple(self._tables)}.")
    table = self._tables[split]
    texts = [self._texts(table, name, split) for name in self.text_columns]
    features = single_label.encode_texts(
        tokenizer, texts[0], texts[1] if len(texts) > 1 else None,
        max_seq_length)
    targets = self._targets[split]
    if targets is None:
      fill = (np.nan, np.float32) if self.regression else (-1, np.int32)
      features["labels"] = np.full(len(table.rows), *fill)
    else:
      features["labels"] = targets[0]
    return task_lib.Split(
        name=split, features=features, has_labels=targets is not None,
        examples=Rows(np.arange(len(table.rows)),
                      None if targets is None else targets[1]))

  def evaluate(self, predictions: dict[str, np.ndarray],
               split: task_lib.Split) -> dict[str, float]:
    pred = single_label.row_predictions(predictions, split)
    labels = split.features["labels"]
    if self.regression:
      return task_metrics.pearson_and_spearman(pred, labels)
    return task_metrics.classification(pred, labels, self.num_labels)

  def write_predictions(self, predictions: dict[str, np.ndarray],
                        split: task_lib.Split, directory: str) -> list[str]:
    """`<split>_predictions.tsv`: row, prediction (and label)."""
    pred = single_label.row_predictions(predictions, split)
    rows: Rows = split.examples
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow(["row", "prediction"] + (["label"] if rows.gold else []))
    for i, p in enumerate(pred):
      shown = f"{float(p):.6f}" if self.regression else self.labels[int(p)]
      writer.writerow([int(rows.index[i]), shown] +
                      ([rows.gold[i]] if rows.gold else []))
    path = storage.path(directory) / f"{split.name}_predictions.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(path, out.getvalue())
    return [os.fspath(path)]


def _warn_if_eval_is_train(train: Table, evaluation: Table) -> None:
  """Warns (once per run: the task is made once) when the eval file holds
  the train file's rows: the best checkpoint would be picked, and the
  final metrics reported, on rows the model trained on."""
  if storage.same_file(train.path, evaluation.path) or (
      evaluation.rows and evaluation.rows == train.rows):
    log.warning(
        "data.eval_file %s holds the same rows as data.train_file %s: the "
        "best checkpoint is picked, and eval metrics are measured, on "
        "training rows, which says nothing of unseen text. Hold rows out "
        "for evaluation: python -m albert_jax.finetune.data_files split "
        "%s OUT_DIR cuts one file into train, eval and test files.",
        evaluation.path, train.path, train.path)


def make_task(name: str, data) -> FilesTask:
  """The user's task from `data` (see the module docstring); name "files"."""
  if name != "files":
    raise ValueError(f"Unknown task {name!r}; this module defines ('files',).")
  return FilesTask(data)
