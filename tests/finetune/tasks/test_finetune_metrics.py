"""Tests for albert_jax.finetune.tasks.classification.official_metrics: parity with scikit-learn and SciPy,
and hand-worked values."""

import warnings

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

from albert_jax.finetune.tasks.classification import official_metrics as task_metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")


def _pairs(element, max_size=40):
  """Two equal-length lists drawn from `element`."""
  return st.integers(1, max_size).flatmap(lambda n: st.tuples(
      st.lists(element, min_size=n, max_size=n),
      st.lists(element, min_size=n, max_size=n)))


# Few distinct values (ties, constant columns) or spread-out ones.
_TIED = st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0])
_SPREAD = st.integers(-4000, 4000).map(lambda i: i / 8.0)
_VALUES = st.one_of(_pairs(_TIED), _pairs(_SPREAD),
                    _pairs(st.floats(-1e6, 1e6, allow_subnormal=False)))


def _quiet(fn, *args, **kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return fn(*args, **kwargs)


@settings(max_examples=100, deadline=None)
@given(_pairs(st.integers(0, 2)))
def test_classification_scores_match_sklearn(pair):
  pred, gold = (np.array(v) for v in pair)
  assert task_metrics.accuracy(pred, gold) == sklearn_metrics.accuracy_score(
      gold, pred)
  if set(np.r_[pred, gold]) <= {0, 1}:
    assert task_metrics.f1_binary(pred, gold) == pytest.approx(
        _quiet(sklearn_metrics.f1_score, gold, pred, zero_division=0.0),
        abs=1e-12)
  # Binary F1 of class 1 in any number of classes: per-class F1.
  per_class = _quiet(sklearn_metrics.f1_score, gold, pred, labels=[1],
                     average=None, zero_division=0.0)[0]
  assert task_metrics.f1_binary(pred, gold) == pytest.approx(per_class,
                                                             abs=1e-12)
  assert task_metrics.f1_macro(pred, gold) == pytest.approx(
      _quiet(sklearn_metrics.f1_score, gold, pred, average="macro",
             zero_division=0.0), abs=1e-12)
  assert task_metrics.matthews_corrcoef(pred, gold) == pytest.approx(
      _quiet(sklearn_metrics.matthews_corrcoef, gold, pred), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_correlations_match_scipy(pair):
  pred, gold = (np.array(v, np.float64) for v in pair)
  defined = len(pred) > 1 and np.ptp(pred) > 0 and np.ptp(gold) > 0
  r = task_metrics.pearson(pred, gold)
  rho = task_metrics.spearman(pred, gold)
  if not defined:
    # SciPy says NaN; metrics says 0 so checkpoint selection keeps working.
    assert r == 0.0 and rho == 0.0
    return
  assert r == pytest.approx(_quiet(stats.pearsonr, pred, gold).statistic,
                            abs=1e-9)
  assert rho == pytest.approx(_quiet(stats.spearmanr, pred, gold).statistic,
                              abs=1e-9)
  np.testing.assert_array_equal(task_metrics.rank_average(pred),
                                stats.rankdata(pred, method="average"))
  assert task_metrics.mean_squared_error(pred, gold) == pytest.approx(
      sklearn_metrics.mean_squared_error(gold, pred), rel=1e-12)


def test_hand_worked_classification():
  pred = [1, 1, 0, 1, 0, 0]
  gold = [1, 0, 0, 1, 1, 0]
  # tp=2 fp=1 fn=1 tn=2.
  assert task_metrics.accuracy(pred, gold) == 4 / 6
  assert task_metrics.f1_binary(pred, gold) == 2 / 3  # 2·2 / (2·2 + 1 + 1)
  # (tp·tn − fp·fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = 3 / 9.
  assert task_metrics.matthews_corrcoef(pred, gold) == pytest.approx(
      1 / 3, abs=1e-15)
  assert task_metrics.accuracy_and_f1(pred, gold) == {
      "accuracy": 4 / 6, "f1": 2 / 3, "accuracy_f1_mean": (4 / 6 + 2 / 3) / 2}
  # Three classes: per-class F1 of 0, 1, 2 is 1, 2/3, 0.
  assert task_metrics.f1_macro([0, 1, 1, 2], [0, 1, 2, 1]) == pytest.approx(
      (1 + 0.5 + 0) / 3)


def test_degenerate_cases_are_zero():
  assert task_metrics.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0
  assert task_metrics.matthews_corrcoef([0, 1, 0], [1, 1, 1]) == 0.0
  assert task_metrics.f1_binary([0, 0], [0, 0]) == 0.0
  assert task_metrics.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
  assert task_metrics.spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 0.0
  assert task_metrics.pearson([1.0], [3.0]) == 0.0
  assert task_metrics.pearson([1.0, 2.0], [5.0, 3.0]) == -1.0


def test_hand_worked_correlations():
  # Ranks with ties: [1, 2.5, 2.5, 4] and [1, 2, 3, 4].
  np.testing.assert_array_equal(task_metrics.rank_average([10, 20, 20, 30]),
                                [1.0, 2.5, 2.5, 4.0])
  # Pearson of x and 2x + 1 is 1; of x and a reversed copy −1.
  assert task_metrics.pearson([1, 2, 3, 4], [3, 5, 7, 9]) == pytest.approx(1.0)
  assert task_metrics.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  # x = [1, 2, 3], y = [1, 3, 2]: centred (−1, 0, 1)·(−1, 1, 0) = 1, norms
  # √2 · √2 → r = 1/2; the ranks equal the values, so ρ = 1/2 too.
  report = task_metrics.pearson_and_spearman([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
  assert report == pytest.approx({"pearson": 0.5, "spearman": 0.5,
                                  "pearson_spearman_mean": 0.5,
                                  "mse": 2 / 3}, abs=1e-15)
  # A monotone but non-linear relation: Spearman 1, Pearson below.
  assert task_metrics.spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(
      1.0)
  assert task_metrics.pearson([1, 2, 3, 4], [1, 8, 27, 64]) < 0.99


def test_user_task_reports():
  assert task_metrics.classification([0, 1, 1], [0, 1, 0], 2) == {
      "accuracy": 2 / 3, "f1": 2 / 3}
  report = task_metrics.classification([0, 1, 2, 2], [0, 1, 2, 1], 3)
  assert report == pytest.approx({"accuracy": 0.75,
                                  "macro_f1": (1 + 2 / 3 + 2 / 3) / 3})


def test_bad_inputs_are_refused():
  with pytest.raises(ValueError, match="same length"):
    task_metrics.accuracy([1, 2], [1])
  with pytest.raises(ValueError, match="no rows"):
    task_metrics.pearson([], [])
