"""The GLUE benchmark through TFDS, scored and submitted the official way.

`make_task("glue/NAME", data)` for cola, sst2, mrpc, qqp, stsb, mnli, qnli,
rte, wnli and ax. Rows are `[CLS] a [SEP] b [SEP]` from the TFDS text
features (sentence; sentence1+sentence2; question1+question2;
premise+hypothesis; question+sentence), sorted by GLUE's `idx` (TFDS stores
examples in a hashed order).

Metrics follow GLUE: Matthews correlation for CoLA, accuracy and F1 for
MRPC/QQP, Pearson and Spearman for STS-B (plus the MSE the official ALBERT
script prints), accuracy elsewhere. The checkpoint-selection `metric` is
"mcc" for CoLA, "f1" for MRPC/QQP, "pearson" for STS-B (the official ALBERT
script's choice) and "accuracy" otherwise; MNLI's is the matched accuracy,
its first eval split.

MNLI evaluates on validation_matched and validation_mismatched and predicts
test_matched, test_mismatched and, with `data.glue_ax`, the diagnostic set
"ax" (GLUE scores AX with the MNLI model). "glue/ax" is that MNLI model with
AX as its only prediction split. Prediction files are those the GLUE server takes (CoLA.tsv,
SST-2.tsv, MRPC.tsv, QQP.tsv, STS-B.tsv, MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv,
RTE.tsv, WNLI.tsv, AX.tsv: header `index<TAB>prediction`, label names for
MNLI/AX/QNLI/RTE, 0/1 elsewhere, STS-B clipped to [0, 5]); a labelled split
also gets `<split>_predictions.tsv` (idx, prediction, label; STS-B values
unclipped, so the file reproduces the metrics).

`data` keys read (all optional):
  tfds_data_dir: where TFDS keeps its datasets, local or gs:// (default
    None: TFDS's own default, ~/tensorflow_datasets or $TFDS_DATA_DIR).
  tfds_download: let TFDS download and prepare a missing dataset (default
    True; False fails fast on a machine without internet access).
  glue_ax: add the AX diagnostic set to MNLI's prediction splits (default
    False: AX is a separate TFDS dataset, downloaded only when asked for,
    so a run never reaches its end to fail on a download; the GLUE
    leaderboard needs AX.tsv, so set it for a submission).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np

from albert_jax import storage
from albert_jax.finetune import task as task_lib
from albert_jax.finetune.tasks.classification import official_metrics as task_metrics
from albert_jax.finetune.tasks.classification import single_label
from albert_jax.finetune.tfds_source import TfdsSource

_NLI3 = ("entailment", "neutral", "contradiction")
_NLI2 = ("entailment", "not_entailment")
AX_SPLIT = "ax"


@dataclasses.dataclass(frozen=True)
class Spec:
  """What differs between GLUE tasks.

  Attributes:
    tfds_name: the TFDS dataset ("glue/mnli").
    texts: TFDS text features, one or two.
    metric: the checkpoint-selection metric.
    files: submission file per prediction split.
    label_names: the TFDS ClassLabel names in class-id order (empty for
      regression); their number is the number of classes.
    named: whether GLUE submissions write label names (else class ids).
    eval_splits: TFDS split names evaluated during training.
    regression: STS-B.
  """
  tfds_name: str
  texts: tuple[str, ...]
  metric: str
  files: dict[str, str]
  label_names: tuple[str, ...] = ()
  named: bool = False
  eval_splits: tuple[str, ...] = ("validation",)
  regression: bool = False


def _spec(name, texts, metric, file, labels, **kw) -> Spec:
  return Spec(f"glue/{name}", texts, metric, {"test": file}, labels, **kw)


_MNLI_FILES = {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv",
               AX_SPLIT: "AX.tsv"}
SPECS: dict[str, Spec] = {
    "cola": _spec("cola", ("sentence",), "mcc", "CoLA.tsv",
                  ("unacceptable", "acceptable")),
    "sst2": _spec("sst2", ("sentence",), "accuracy", "SST-2.tsv",
                  ("negative", "positive")),
    "mrpc": _spec("mrpc", ("sentence1", "sentence2"), "f1", "MRPC.tsv",
                  ("not_equivalent", "equivalent")),
    "qqp": _spec("qqp", ("question1", "question2"), "f1", "QQP.tsv",
                 ("not_duplicate", "duplicate")),
    "stsb": _spec("stsb", ("sentence1", "sentence2"), "pearson", "STS-B.tsv",
                  (), regression=True),
    "mnli": Spec("glue/mnli", ("premise", "hypothesis"), "accuracy",
                 _MNLI_FILES, _NLI3, named=True,
                 eval_splits=("validation_matched", "validation_mismatched")),
    "qnli": _spec("qnli", ("question", "sentence"), "accuracy", "QNLI.tsv",
                  _NLI2, named=True),
    "rte": _spec("rte", ("sentence1", "sentence2"), "accuracy", "RTE.tsv",
                 _NLI2, named=True),
    "wnli": _spec("wnli", ("sentence1", "sentence2"), "accuracy", "WNLI.tsv",
                  ("not_entailment", "entailment")),
}
TASKS = tuple(f"glue/{n}" for n in SPECS) + ("glue/ax",)


@dataclasses.dataclass(frozen=True)
class Rows:
  """Per-row bookkeeping of a loaded split.

  Attributes:
    idx: [N] GLUE's example index (the submission's `index`), ascending.
    file: the submission file this split feeds, or None (eval splits).
  """
  idx: np.ndarray
  file: Optional[str]


class GlueTask(single_label.SingleLabelTask):
  """One GLUE task (see the module docstring)."""

  def __init__(self, name: str, spec: Spec, data, predict_splits):
    self.name, self.spec = name, spec
    self.metric = spec.metric
    self.num_labels, self.regression = len(spec.label_names), spec.regression
    self.eval_splits = spec.eval_splits
    self.predict_splits = tuple(predict_splits)
    self.source = TfdsSource.from_data(data)

  @property
  def splits(self) -> tuple[str, ...]:
    return (self.train_split,) + self.eval_splits + tuple(self.spec.files)

  def load(self, split: str, tokenizer, max_seq_length: int) -> task_lib.Split:
    """Reads a split from TFDS and featurizes it.

    Returns:
      A Split with INPUT_KEYS int32 [N, max_seq_length] and "labels" [N]
      (int32, float32 for STS-B; -1 on test splits), and `Rows` examples.
    """
    if split not in self.splits:
      raise ValueError(f"{self.name} has no split {split!r}; choose one of "
                       f"{self.splits}.")
    tfds_name, tfds_split = ((f"glue/{AX_SPLIT}", "test") if split == AX_SPLIT
                             else (self.spec.tfds_name, split))
    columns = self._read(tfds_name, tfds_split)
    if not len(columns["idx"]):
      raise ValueError(f"TFDS {tfds_name} split {tfds_split!r} is empty.")
    order = np.argsort(columns["idx"], kind="stable")
    texts = [[_text(columns[k][i]) for i in order] for k in self.spec.texts]
    features = single_label.encode_texts(tokenizer, texts[0],
                                  texts[1] if len(texts) > 1 else None,
                                  max_seq_length)
    dtype = np.float32 if self.regression else np.int32
    features["labels"] = columns["label"][order].astype(dtype)
    labelled = split == self.train_split or split in self.eval_splits
    return task_lib.Split(
        name=split, features=features, has_labels=labelled,
        examples=Rows(idx=columns["idx"][order].astype(np.int64),
                      file=self.spec.files.get(split)))

  def _read(self, tfds_name: str, tfds_split: str) -> dict[str, np.ndarray]:
    """The split's columns (texts as bytes, "label", "idx") as arrays."""
    chunks = list(self.source.examples(
        tfds_name, tfds_split, batch=4096, check=lambda info:
        self._check_label_names(tfds_name, info.features["label"])))
    keys = ("idx", "label") + self.spec.texts
    return {k: np.concatenate([c[k] for c in chunks]) if chunks else
            np.zeros((0,)) for k in keys}

  def _check_label_names(self, tfds_name: str, feature) -> None:
    """Class ids mean what GLUE's do only in this order; a TFDS release
    that reordered the labels would silently mislabel a submission."""
    if self.regression:
      return
    names = tuple(getattr(feature, "names", ()))
    if names != self.spec.label_names:
      raise ValueError(
          f"TFDS {tfds_name} labels are {names}, expected "
          f"{self.spec.label_names}; this version of tensorflow-datasets "
          "orders them differently, so predictions would be mislabelled.")

  def label_names(self) -> tuple[str, ...]:
    return tuple(self.spec.label_names)

  def text_names(self) -> tuple[str, ...]:
    return tuple(self.spec.texts)

  def evaluate(self, predictions: dict[str, np.ndarray],
               split: task_lib.Split) -> dict[str, float]:
    pred = single_label.row_predictions(predictions, split)
    labels = split.features["labels"]
    if self.regression:
      return task_metrics.pearson_and_spearman(pred, labels)
    if self.metric == "mcc":
      return task_metrics.mcc_and_accuracy(pred, labels)
    if self.metric == "f1":
      return task_metrics.accuracy_and_f1(pred, labels)
    return {"accuracy": task_metrics.accuracy(pred, labels)}

  def _render(self, value, clip: bool) -> str:
    """One prediction as GLUE writes it."""
    if self.regression:
      value = min(max(float(value), 0.0), 5.0) if clip else float(value)
      return f"{value:.6f}"
    if self.spec.named:
      return self.spec.label_names[int(value)]
    return str(int(value))

  def write_predictions(self, predictions: dict[str, np.ndarray],
                        split: task_lib.Split, directory: str) -> list[str]:
    """The GLUE submission file (prediction splits) and, for a labelled
    split, `<split>_predictions.tsv` with idx, prediction and label."""
    pred = single_label.row_predictions(predictions, split)
    rows: Rows = split.examples
    root = storage.path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    if rows.file is not None:
      paths.append(os.fspath(root / rows.file))
      lines = [f"{i}\t{self._render(p, clip=True)}"
               for i, p in zip(rows.idx, pred)]
      _write_tsv(paths[-1], "index\tprediction", lines)
    if split.has_labels:
      paths.append(os.fspath(root / f"{split.name}_predictions.tsv"))
      lines = [f"{i}\t{self._render(p, False)}\t{self._render(y, False)}"
               for i, p, y in zip(rows.idx, pred, split.features["labels"])]
      _write_tsv(paths[-1], "idx\tprediction\tlabel", lines)
    return paths


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _write_tsv(path: str, header: str, lines: list[str]) -> None:
  storage.write_atomic(path, "\n".join([header] + lines) + "\n")


def make_task(name: str, data=None) -> GlueTask:
  """The GLUE task `name` ("glue/mrpc", ...); `data` is the run's
  config.data (see the module docstring for the keys read)."""
  data = {} if data is None else data
  if name not in TASKS:
    raise ValueError(f"Unknown GLUE task {name!r}; choose one of {TASKS}.")
  short = name[len("glue/"):]
  if short == AX_SPLIT:
    return GlueTask(name, SPECS["mnli"], data, predict_splits=(AX_SPLIT,))
  spec = SPECS[short]
  with_ax = bool(data.get("glue_ax", False))
  predict = [s for s in spec.files if s != AX_SPLIT or with_ax]
  return GlueTask(name, spec, data, predict_splits=predict)
