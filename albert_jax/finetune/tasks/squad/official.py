"""The official SQuAD metrics: the v1.1 and v2.0 evaluation scripts.

Ported line for line: v1.1's exact match and token F1 (max over the gold
answers), v2.0's per-question scores with the HasAns/NoAns breakdown and the
no-answer threshold search `find_best_thresh`. `tune_null_threshold` is
ALBERT's `evaluate_v2`: the threshold is tuned on the evaluated split and
the predictions are rewritten with `best_f1_thresh`, by the eval script's
rule (null where the odds exceed the threshold). Unlike `evaluate_v2`, the
script's default probability threshold (1.0) is not also applied to the
null odds, which are logits here, not probabilities.
"""

from __future__ import annotations

import collections
import math
import re
import string
from typing import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
  """Lower text and remove punctuation, articles and extra whitespace."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", s).split())


def f1_v1(prediction: str, ground_truth: str) -> float:
  """SQuAD v1.1 token F1."""
  pred = normalize_answer(prediction).split()
  gold = normalize_answer(ground_truth).split()
  same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 2 * precision * recall / (precision + recall)


def f1_v2(gold: str, prediction: str) -> float:
  """SQuAD v2.0 `compute_f1`: an empty answer scores 1 only against empty."""
  gold_toks = normalize_answer(gold).split() if gold else []
  pred_toks = normalize_answer(prediction).split() if prediction else []
  if not gold_toks or not pred_toks:
    return float(gold_toks == pred_toks)
  same = sum((collections.Counter(gold_toks) &
              collections.Counter(pred_toks)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_toks), same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def squad_v1_metrics(predictions: dict, golds: dict) -> dict:
  """Official v1.1 `evaluate`: {"exact_match", "f1"} in percent.

  Args:
    predictions: question id → predicted text.
    golds: question id → list of gold answer texts. A question without a
      prediction (or without golds) scores 0.
  """
  exact = f1 = 0.0
  for qid, answers in golds.items():
    if qid not in predictions or not answers:
      continue
    pred = predictions[qid]
    exact += max(float(normalize_answer(pred) == normalize_answer(a))
                 for a in answers)
    f1 += max(f1_v1(pred, a) for a in answers)
  total = max(len(golds), 1)
  return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def raw_scores_v2(predictions: dict, golds: dict) -> tuple[dict, dict]:
  """Official v2.0 `get_raw_scores`: per-question exact and F1 (0/1 floats)."""
  exact, f1 = {}, {}
  for qid, answers in golds.items():
    answers = [a for a in answers if normalize_answer(a)] or [""]
    if qid not in predictions:
      continue
    pred = predictions[qid]
    exact[qid] = max(float(normalize_answer(a) == normalize_answer(pred))
                     for a in answers)
    f1[qid] = max(f1_v2(a, pred) for a in answers)
  return exact, f1


def _eval_dict(exact: dict, f1: dict, qids: Sequence[str]) -> dict:
  total = len(qids)
  return {"exact": 100.0 * sum(exact[q] for q in qids) / max(total, 1),
          "f1": 100.0 * sum(f1[q] for q in qids) / max(total, 1),
          "total": total}


def _best_switch(predictions: dict, scores: dict, na_probs: dict,
                 has_answer: dict) -> tuple[float, float, bool]:
  """`find_best_thresh`, also saying whether any switch beat "all null"."""
  cur = best = sum(1 for q in has_answer if not has_answer[q])
  best_thresh, switched = 0.0, False
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if has_answer[qid]:
      diff = scores[qid]
    else:
      diff = -1 if predictions[qid] else 0
    cur += diff
    if cur > best:
      best, best_thresh, switched = cur, na_probs[qid], True
  return 100.0 * best / max(len(scores), 1), best_thresh, switched


def null_threshold(best: dict, null_odds: dict, golds: dict) -> float:
  """The no-answer threshold `tune_null_threshold` applies: an answer is
  dropped where its null odds exceed it; -inf where answering nothing was
  best (every answer dropped)."""
  _, f1 = raw_scores_v2(best, golds)
  has_answer = {q: bool(golds[q]) for q in golds}
  _, thresh, switched = _best_switch(best, f1, null_odds, has_answer)
  return float(thresh) if switched else -math.inf


def find_best_thresh(predictions: dict, scores: dict, na_probs: dict,
                     has_answer: dict) -> tuple[float, float]:
  """Official v2.0 `find_best_thresh`: the best score over null thresholds.

  Starting from "every answer null", questions are switched to their
  prediction in increasing null odds; the threshold is the odds of the last
  switch that improved the score (0.0 if none did). Returns (best score %,
  threshold).
  """
  return _best_switch(predictions, scores, na_probs, has_answer)[:2]


def squad_v2_metrics(predictions: dict, golds: dict) -> dict:
  """Official v2.0 evaluation of final predictions (no threshold applied)."""
  exact, f1 = raw_scores_v2(predictions, golds)
  out = _eval_dict(exact, f1, list(exact))
  # As the official script: "has an answer" means a non-empty gold list.
  has = [q for q in exact if golds[q]]
  no = [q for q in exact if not golds[q]]
  for prefix, qids in (("HasAns", has), ("NoAns", no)):
    if qids:
      for k, v in _eval_dict(exact, f1, qids).items():
        out[f"{prefix}_{k}"] = v
  return out


def tune_null_threshold(best: dict, null_odds: dict,
                        golds: dict) -> tuple[dict, dict]:
  """ALBERT's `evaluate_v2`: tune the no-answer threshold, then rescore.

  Args:
    best: question id → best non-empty answer.
    null_odds: question id → no-answer score.
    golds: question id → gold answers ([] when unanswerable).

  Returns:
    (metrics, predictions): `predictions` answers "" where the null odds
    exceed `best_f1_thresh` (the official `apply_no_ans_threshold` rule), or
    everywhere when no threshold beat answering nothing (the official
    threshold is then 0.0, which with logit odds would not mean "all null"),
    so their F1 is `best_f1`. `metrics` holds their official scores plus
    best_exact(_thresh) and best_f1(_thresh) found on `best`.
  """
  exact, f1 = raw_scores_v2(best, golds)
  has_answer = {q: bool(golds[q]) for q in golds}
  best_exact, exact_thresh = find_best_thresh(best, exact, null_odds,
                                              has_answer)
  best_f1, f1_thresh, switched = _best_switch(best, f1, null_odds, has_answer)
  final = {q: ("" if not switched or null_odds[q] > f1_thresh else text)
           for q, text in best.items()}
  metrics = squad_v2_metrics(final, golds)
  metrics.update(best_exact=best_exact, best_exact_thresh=exact_thresh,
                 best_f1=best_f1, best_f1_thresh=f1_thresh)
  return metrics, final
