"""Official metric definitions for classification and regression tasks.

Pure numpy, computed in float64 on the host from all of a split's
predictions. Each function follows the reference implementation GLUE results
are reported with (scikit-learn for accuracy, F1 and Matthews correlation,
SciPy for Pearson and Spearman), including their conventions for degenerate
inputs:

  * F1 is 0 when there is no true positive (scikit-learn's zero_division=0).
  * Matthews correlation is 0 when a marginal is constant (scikit-learn).
  * Pearson and Spearman are 0 when either input is constant. SciPy returns
    NaN there; a NaN would never compare greater than anything, so a run
    whose first evaluation had constant predictions could never select a
    better checkpoint afterwards.

The bundles at the end (`accuracy_and_f1`, `pearson_and_spearman`, ...) are
the per-task reports GLUE uses, including the means it ranks MRPC/QQP and
STS-B by.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def _pair(predictions, labels, name: str):
  """Both as 1-D arrays of equal length; refuses mismatches and empties."""
  p, y = np.asarray(predictions), np.asarray(labels)
  if p.ndim != 1 or y.ndim != 1 or p.shape != y.shape:
    raise ValueError(f"{name}: predictions {p.shape} and labels {y.shape} "
                     "must be 1-D arrays of the same length.")
  if p.size == 0:
    raise ValueError(f"{name}: no rows to score.")
  return p, y


def accuracy(predictions, labels) -> float:
  """Fraction of rows whose prediction equals the label. Inputs: [N]."""
  p, y = _pair(predictions, labels, "accuracy")
  return float(np.mean(p == y))


def _f1(tp: float, fp: float, fn: float) -> float:
  # 2PR/(P+R) simplified; 0 when tp = 0, matching zero_division=0.
  return 0.0 if tp == 0 else 2.0 * tp / (2.0 * tp + fp + fn)


def f1_binary(predictions, labels, positive=1) -> float:
  """F1 of the `positive` class (GLUE's MRPC/QQP F1). Inputs: [N]."""
  p, y = _pair(predictions, labels, "f1_binary")
  tp = np.sum((p == positive) & (y == positive))
  fp = np.sum((p == positive) & (y != positive))
  fn = np.sum((p != positive) & (y == positive))
  return _f1(float(tp), float(fp), float(fn))


def f1_macro(predictions, labels,
             classes: Optional[Sequence] = None) -> float:
  """Unweighted mean of per-class F1. Inputs: [N].

  Args:
    predictions: [N] predicted classes.
    labels: [N] gold classes.
    classes: classes to average over; default the classes present in either
      input, as scikit-learn's `f1_score(average="macro")` does.
  """
  p, y = _pair(predictions, labels, "f1_macro")
  if classes is None:
    classes = np.union1d(p, y)
  return float(np.mean([f1_binary(p, y, positive=c) for c in classes]))


def matthews_corrcoef(predictions, labels) -> float:
  """Matthews correlation (GLUE's CoLA metric), multi-class form. Inputs: [N].

  Gorodkin's R_K from the confusion matrix, as scikit-learn computes it;
  0 when every label or every prediction is the same class.
  """
  p, y = _pair(predictions, labels, "matthews_corrcoef")
  classes, codes = np.unique(np.concatenate([y, p]), return_inverse=True)
  k, n = len(classes), len(y)
  confusion = np.zeros((k, k), np.float64)
  np.add.at(confusion, (codes[:n], codes[n:]), 1.0)
  t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
  correct, total = np.trace(confusion), float(n)
  cov_yp = correct * total - np.dot(t_sum, p_sum)
  cov_pp = total ** 2 - np.dot(p_sum, p_sum)
  cov_yy = total ** 2 - np.dot(t_sum, t_sum)
  if cov_pp * cov_yy == 0:
    return 0.0
  return float(cov_yp / np.sqrt(cov_pp * cov_yy))


def pearson(predictions, labels) -> float:
  """Pearson correlation (GLUE's STS-B metric). Inputs: [N] floats.

  Computed as SciPy's `pearsonr` does (centre, scaled norms, dot, clip to
  [-1, 1], exactly ±1 for two rows); 0 when either input is constant or
  there is a single row.
  """
  p, y = _pair(predictions, labels, "pearson")
  p, y = p.astype(np.float64), y.astype(np.float64)
  if len(p) < 2 or np.all(p == p[0]) or np.all(y == y[0]):
    return 0.0
  pm, ym = p - p.mean(), y - y.mean()
  # Scaling by the largest deviation keeps the norm from overflowing.
  pmax, ymax = np.max(np.abs(pm)), np.max(np.abs(ym))
  if pmax == 0 or ymax == 0:  # values so close that centring cancels them
    return 0.0
  pn = pmax * np.linalg.norm(pm / pmax)
  yn = ymax * np.linalg.norm(ym / ymax)
  r = float(np.clip(np.sum((pm / pn) * (ym / yn)), -1.0, 1.0))
  return float(round(r)) if len(p) == 2 else r


def rank_average(values) -> np.ndarray:
  """1-based ranks, ties sharing their mean rank. [N] → [N] float64.

  SciPy's `rankdata(method="average")`: the tied values at sorted positions
  i..j (0-based) all get (i + j) / 2 + 1.
  """
  x = np.asarray(values)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  # Start of each run of equal values in sorted order.
  starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
  ends = np.r_[starts[1:], len(x)] - 1
  run_rank = (starts + ends) / 2.0 + 1.0
  ranks = np.empty(len(x), np.float64)
  ranks[order] = np.repeat(run_rank, ends - starts + 1)
  return ranks


def spearman(predictions, labels) -> float:
  """Spearman's rho: Pearson of average ranks. Inputs: [N]; 0 if constant."""
  p, y = _pair(predictions, labels, "spearman")
  return pearson(rank_average(p), rank_average(y))


def mean_squared_error(predictions, labels) -> float:
  """Mean of (prediction − label)². Inputs: [N] floats."""
  p, y = _pair(predictions, labels, "mean_squared_error")
  return float(np.mean(np.square(p.astype(np.float64) - y)))


# Per-task reports, as GLUE states them.


def accuracy_and_f1(predictions, labels) -> dict[str, float]:
  """MRPC and QQP: accuracy, F1 of class 1, and their mean."""
  acc = accuracy(predictions, labels)
  f1 = f1_binary(predictions, labels, positive=1)
  return {"accuracy": acc, "f1": f1, "accuracy_f1_mean": (acc + f1) / 2}


def pearson_and_spearman(predictions, labels) -> dict[str, float]:
  """STS-B: Pearson, Spearman, their mean, and the MSE the official
  ALBERT script also reports."""
  r, rho = pearson(predictions, labels), spearman(predictions, labels)
  return {"pearson": r, "spearman": rho, "pearson_spearman_mean": (r + rho) / 2,
          "mse": mean_squared_error(predictions, labels)}


def mcc_and_accuracy(predictions, labels) -> dict[str, float]:
  """CoLA: Matthews correlation (its official metric) and accuracy."""
  return {"mcc": matthews_corrcoef(predictions, labels),
          "accuracy": accuracy(predictions, labels)}


def classification(predictions, labels, num_classes: int) -> dict[str, float]:
  """A user task's report: accuracy, plus F1 of class 1 with two classes or
  macro F1 (scikit-learn's default: over the classes present in the labels
  or the predictions) with more."""
  out = {"accuracy": accuracy(predictions, labels)}
  if num_classes == 2:
    out["f1"] = f1_binary(predictions, labels, positive=1)
  elif num_classes > 2:
    out["macro_f1"] = f1_macro(predictions, labels)
  return out
