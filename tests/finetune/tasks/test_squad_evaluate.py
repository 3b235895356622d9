"""Tests for albert_jax.finetune.tasks.squad.evaluate: n-best spans and official
metrics, on hand-worked cases."""

import math

import numpy as np
import pytest

from albert_jax.finetune.tasks.squad import evaluate as se
from albert_jax.finetune.tasks.squad import official

# "alpha beta gamma delta epsilon", read through two windows of three context
# tokens (stride 2): [CLS] q [SEP] w0 w1 w2 [SEP] pad.
CONTEXT = "alpha beta gamma delta epsilon"
NEG = -9.0


def _examples():
  starts = [[-1, -1, -1, 0, 6, 11, -1, -1], [-1, -1, -1, 11, 17, 23, -1, -1]]
  ends = [[-1, -1, -1, 5, 10, 16, -1, -1], [-1, -1, -1, 16, 22, 30, -1, -1]]
  # "gamma" has one token of context either side in both windows: the first
  # window wins the tie, so it is not max-context in the second.
  max_ctx = [[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 0, 0]]
  return se.SquadExamples(
      ids=["q"], contexts=[CONTEXT], answers=[["gamma"]],
      row_example=np.array([0, 0]), token_start=np.array(starts, np.int32),
      token_end=np.array(ends, np.int32),
      max_context=np.array(max_ctx, bool))


def _logits():
  start = np.array([[1.0, NEG, NEG, 2.0, 0.5, 5.0, NEG, NEG],
                    [0.0, NEG, NEG, 6.0, 3.0, 1.0, NEG, NEG]])
  end = np.array([[0.0, NEG, NEG, 1.0, 3.0, 4.0, NEG, NEG],
                  [0.0, NEG, NEG, 0.5, 1.0, 2.5, NEG, NEG]])
  return start, end


def test_top_indexes_keep_ties_in_order():
  scores = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]])
  np.testing.assert_array_equal(se.top_indexes(scores, 3), [[1, 2, 4]])


def test_logit_candidates_apply_the_official_filters():
  start, end = _logits()
  cands = se.logit_candidates(start, end, _examples(), n_best_size=3,
                              max_answer_length=2)
  # Window 0: starts 5, 3, 0(CLS) × ends 5, 4, 3. Window 1: start 3 (gamma)
  # is not max-context, 4 and 5 are; (4, 3) ends before it starts, (3, 5)
  # in window 0 is 3 tokens long.
  got = list(zip(cands["row"], cands["start"], cands["end"],
                 cands["start_score"], cands["end_score"]))
  assert got == [(0, 5, 5, 5.0, 4.0), (0, 3, 4, 2.0, 3.0),
                 (0, 3, 3, 2.0, 1.0), (1, 4, 5, 3.0, 2.5),
                 (1, 4, 4, 3.0, 1.0), (1, 5, 5, 1.0, 2.5)]


def test_nbest_across_windows():
  start, end = _logits()
  answers = se.span_answers(start, end, _examples(), n_best_size=3,
                            max_answer_length=2, with_null=False)
  probs = [math.exp(9.0), math.exp(5.5), math.exp(5.0)]
  probs = [p / sum(probs) for p in probs]
  assert answers.best == {"q": "gamma"}
  assert answers.null_odds is None
  assert answers.nbest["q"] == [
      {"text": "gamma", "probability": pytest.approx(probs[0]),
       "start_logit": 5.0, "end_logit": 4.0},
      {"text": "delta epsilon", "probability": pytest.approx(probs[1]),
       "start_logit": 3.0, "end_logit": 2.5},
      {"text": "alpha beta", "probability": pytest.approx(probs[2]),
       "start_logit": 2.0, "end_logit": 3.0}]


def test_simple_null_span_joins_the_nbest():
  start, end = _logits()
  answers = se.span_answers(start, end, _examples(), n_best_size=3,
                            max_answer_length=2, with_null=True)
  # [CLS] start+end: window 0 1.0, window 1 0.0 → the minimum, 0.0, is the
  # null score; it ranks below the top 3, so it is appended as a 4th entry.
  texts = [x["text"] for x in answers.nbest["q"]]
  assert texts == ["gamma", "delta epsilon", "alpha beta", ""]
  assert answers.nbest["q"][3]["start_logit"] == 0.0
  assert answers.null_odds == {"q": pytest.approx(0.0 - 9.0)}
  assert answers.best == {"q": "gamma"}
  # A null span scoring above every span leads the list; best stays a span.
  start[:, 0] = 20.0
  answers = se.span_answers(start, end, _examples(), n_best_size=3,
                            max_answer_length=2, with_null=True)
  assert [x["text"] for x in answers.nbest["q"]] == [
      "", "gamma", "delta epsilon"]
  assert answers.best == {"q": "gamma"}
  assert answers.null_odds == {"q": pytest.approx(20.0 - 9.0)}


def test_duplicate_texts_are_dropped():
  ex = se.SquadExamples(
      ids=["d"], contexts=["x y x"], answers=[["x"]], row_example=np.array([0]),
      token_start=np.array([[-1, 0, 2, 4]]),
      token_end=np.array([[-1, 1, 3, 5]]),
      max_context=np.array([[0, 1, 1, 1]], bool))
  start = np.array([[0.0, 3.0, 1.0, 2.0]])
  end = np.array([[0.0, 3.0, 1.0, 2.0]])
  answers = se.span_answers(start, end, ex, n_best_size=4, max_answer_length=1,
                            with_null=False)
  # (1,1) "x" 6.0, (3,3) "x" 4.0 (dropped), (2,2) "y" 2.0.
  assert [(x["text"], x["start_logit"]) for x in answers.nbest["d"]] == [
      ("x", 3.0), ("y", 1.0)]


def test_no_valid_span_gives_an_empty_answer():
  ex = se.SquadExamples(
      ids=["e"], contexts=["x"], answers=[["x"]], row_example=np.array([0]),
      token_start=np.array([[-1, 0]]), token_end=np.array([[-1, 1]]),
      max_context=np.array([[0, 0]], bool))
  answers = se.span_answers(np.zeros((1, 2)), np.zeros((1, 2)), ex, 5, 5,
                            with_null=False)
  assert answers.best == {"e": ""}
  assert answers.nbest["e"] == [{"text": "", "probability": 1.0,
                                 "start_logit": -1e6, "end_logit": -1e6}]


def test_beam_answers():
  ex = _examples()
  preds = {  # k = k' = 2
      "start_top_index": np.array([[5, 3], [4, 3]]),
      "start_top_log_probs": np.array([[-0.1, -2.0], [-0.5, -1.5]]),
      # start 5: ends 5, 4; start 3: ends 4, 5 (window 1 likewise).
      "end_top_index": np.array([[5, 4, 4, 5], [5, 4, 5, 4]]),
      "end_top_log_probs": np.array([[-0.2, -1.0, -0.5, -0.7],
                                     [-0.3, -0.9, -0.4, -0.6]]),
      "cls_logits": np.array([0.7, -0.4])}
  answers = se.beam_answers(preds, ex, n_best_size=20, max_answer_length=2)
  # Valid: w0 (5,5) -0.3 gamma, (3,4) -2.5 alpha beta; w1 (4,5) -0.8
  # "delta epsilon", (4,4) -1.4 delta; w1 start 3 is not max-context.
  assert [(x["text"], x["start_log_prob"] + x["end_log_prob"])
          for x in answers.nbest["q"]] == [
              ("gamma", pytest.approx(-0.3)),
              ("delta epsilon", pytest.approx(-0.8)),
              ("delta", pytest.approx(-1.4)),
              ("alpha beta", pytest.approx(-2.5))]
  assert answers.null_odds == {"q": pytest.approx(-0.4)}
  assert sum(x["probability"] for x in answers.nbest["q"]) == pytest.approx(1)


def test_normalize_answer():
  assert official.normalize_answer("The  Quick, brown-fox!") == "quick brownfox"
  assert official.normalize_answer("An apple a day") == "apple day"
  assert official.normalize_answer("theatre") == "theatre"  # whole words only
  assert official.normalize_answer("¡Olé!") == "¡olé"  # ASCII punctuation only


def test_squad_v1_metrics():
  golds = {"q1": ["Eiffel Tower", "the tower"], "q2": ["France"],
           "q3": ["1999", "in the year 1999"]}
  preds = {"q1": "the Eiffel Tower", "q2": "Paris, France", "q3": "in 1999"}
  # q1 exact (articles); q2 F1 2/3 (P 1/2, R 1); q3 best gold is the second:
  # P 2/2, R 2/3 → F1 0.8.
  got = official.squad_v1_metrics(preds, golds)
  assert got == {"exact_match": pytest.approx(100 / 3),
                 "f1": pytest.approx(100 * (1 + 2 / 3 + 0.8) / 3)}
  # An unanswered question counts, with 0.
  golds["q4"] = ["anything"]
  got = official.squad_v1_metrics(preds, golds)
  assert got == {"exact_match": pytest.approx(25.0),
                 "f1": pytest.approx(100 * (1 + 2 / 3 + 0.8) / 4)}


def test_v2_raw_scores_empty_golds():
  golds = {"a": ["red", "dark red"], "n": [], "t": ["The"]}
  exact, f1 = official.raw_scores_v2({"a": "red wine", "n": "", "t": "a"}, golds)
  # "red wine" vs "red": P 1/2, R 1; vs "dark red": P 1/2, R 1/2.
  assert exact == {"a": 0.0, "n": 1.0, "t": 1.0}
  assert f1 == {"a": pytest.approx(2 / 3), "n": 1.0, "t": 1.0}
  # A non-empty answer to an unanswerable question scores 0.
  assert official.raw_scores_v2({"n": "red"}, golds) == ({"n": 0.0}, {"n": 0.0})


V2_GOLDS = {"a": ["red"], "b": ["blue sky"], "c": [], "d": []}
V2_BEST = {"a": "red", "b": "sky", "c": "green", "d": "x"}
V2_ODDS = {"a": -2.0, "b": 0.5, "c": 1.0, "d": 2.0}


def test_find_best_thresh():
  exact, f1 = official.raw_scores_v2(V2_BEST, V2_GOLDS)
  has = {q: bool(v) for q, v in V2_GOLDS.items()}
  # All null scores 2 (c, d). In increasing odds: a +1 → 3 (thresh -2),
  # b +2/3 → 11/3 (thresh 0.5), c -1, d -1.
  assert official.find_best_thresh(V2_BEST, f1, V2_ODDS, has) == (
      pytest.approx(100 * 11 / 12), 0.5)
  # Exact: b adds 0, so the best stays after a.
  assert official.find_best_thresh(V2_BEST, exact, V2_ODDS, has) == (75.0, -2.0)


def test_tune_null_threshold_rewrites_predictions():
  metrics, final = official.tune_null_threshold(V2_BEST, V2_ODDS, V2_GOLDS)
  assert final == {"a": "red", "b": "sky", "c": "", "d": ""}
  assert metrics == {
      "exact": 75.0, "f1": pytest.approx(100 * 11 / 12), "total": 4,
      "HasAns_exact": 50.0, "HasAns_f1": pytest.approx(100 * 5 / 6),
      "HasAns_total": 2, "NoAns_exact": 100.0, "NoAns_f1": 100.0,
      "NoAns_total": 2, "best_exact": 75.0, "best_exact_thresh": -2.0,
      "best_f1": pytest.approx(100 * 11 / 12), "best_f1_thresh": 0.5}


def test_squad_v2_metrics_without_unanswerable():
  got = official.squad_v2_metrics({"a": "red"}, {"a": ["red"]})
  assert got == {"exact": 100.0, "f1": 100.0, "total": 1,
                 "HasAns_exact": 100.0, "HasAns_f1": 100.0, "HasAns_total": 1}


def test_all_null_best_rewrites_every_answer():
  # Every non-empty answer is wrong: the best is answering nothing, which
  # the official search reports with its initial threshold 0.0 — not a
  # threshold that would null the negative odds here.
  golds = {"a": ["red"], "c": []}
  best = {"a": "blue", "c": "green"}
  odds = {"a": -5.0, "c": -4.0}
  metrics, final = official.tune_null_threshold(best, odds, golds)
  assert final == {"a": "", "c": ""}
  assert (metrics["best_f1"], metrics["best_f1_thresh"]) == (50.0, 0.0)
  assert metrics["f1"] == metrics["best_f1"] == 50.0
