"""SQuAD post-processing (n-best answer spans) and the official metrics.

A SQuAD example is read through one or more overlapping context windows (rows
of the model). Post-processing collects each example's candidate spans across
its windows as ALBERT's `squad_utils` does: a span must lie in the context,
start on a token whose window is its "max context" one, end at or after its
start and be at most `max_answer_length` tokens; candidates are ranked by
start + end score, duplicates (same text) dropped, the top `n_best_size`
kept. The answer text is the original context between the characters of the
span's first and last tokens, so no detokenisation is involved.

Metrics are the official SQuAD v1.1 script (EM/F1, max over the gold
answers) and the v2.0 script (HasAns/NoAns breakdown and the no-answer
threshold search `find_best_thresh`), ported line for line. For v2.0 the
no-answer threshold is tuned on the evaluated split and the predictions are
rewritten with `best_f1_thresh`, as ALBERT's `evaluate_v2` does, with the
eval script's rule (null where the odds exceed the threshold). Unlike
`evaluate_v2`, the script's default probability threshold (1.0) is not also
applied to the null odds, which are logits here, not probabilities.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import os
import re
import string
from typing import Optional, Sequence

import numpy as np

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


@dataclasses.dataclass
class SquadExamples:
  """What turns window predictions into answers and scores.

  Attributes:
    ids: [E] question ids.
    contexts: [E] the original context strings.
    answers: [E] gold answer texts (empty for an unanswerable question).
    row_example: [N] int32, the example each row (window) belongs to.
    token_start: [N, T] int32, the context character where each token
      starts; -1 outside the context window ([CLS], query, [SEP], padding).
    token_end: [N, T] int32, the character after each token's last one.
    max_context: [N, T] bool, whether this window is the token's max-context
      window (the one where it has the most context on its shorter side).
  """
  ids: list
  contexts: list
  answers: list
  row_example: np.ndarray
  token_start: np.ndarray
  token_end: np.ndarray
  max_context: np.ndarray


@dataclasses.dataclass
class Answers:
  """Post-processed answers of every example, keyed by question id.

  Attributes:
    best: the best non-empty span's text ("" if no valid span).
    nbest: the n-best list, each entry a dict with "text", "probability"
      (softmax over the list's total scores) and the two scores.
    null_odds: v2.0 only, the no-answer score (higher: more likely
      unanswerable); None for v1.1.
  """
  best: dict
  nbest: dict
  null_odds: Optional[dict] = None


def top_indexes(scores: np.ndarray, n: int) -> np.ndarray:
  """[N, T] → [N, min(n, T)] positions of the n highest, ties in order."""
  return np.argsort(-scores, axis=-1, kind="stable")[:, :n]


def _valid_spans(ex: SquadExamples, rows: np.ndarray, starts: np.ndarray,
                 ends: np.ndarray, max_answer_length: int) -> np.ndarray:
  """The official span filter; all arguments broadcast to one shape."""
  start_char = ex.token_start[rows, starts]
  end_char = ex.token_start[rows, ends]
  return ((start_char >= 0) & (end_char >= 0) &
          ex.max_context[rows, starts] & (ends >= starts) &
          (ends - starts + 1 <= max_answer_length))


def logit_candidates(start_logits: np.ndarray, end_logits: np.ndarray,
                     ex: SquadExamples, n_best_size: int,
                     max_answer_length: int) -> dict:
  """Candidates of a start/end logits head: top-n starts × top-n ends.

  Args:
    start_logits, end_logits: [N, T] float.
    ex: the split's examples.
    n_best_size: starts and ends considered per window.
    max_answer_length: longest span in tokens.

  Returns:
    Flat candidate arrays "row", "start", "end", "start_score", "end_score"
    in the official generation order (window, start rank, end rank).
  """
  rows = np.arange(start_logits.shape[0])[:, None, None]
  starts = top_indexes(start_logits, n_best_size)[:, :, None]
  ends = top_indexes(end_logits, n_best_size)[:, None, :]
  rows, starts, ends = np.broadcast_arrays(rows, starts, ends)
  keep = _valid_spans(ex, rows, starts, ends, max_answer_length)
  rows, starts, ends = rows[keep], starts[keep], ends[keep]
  return {"row": rows, "start": starts, "end": ends,
          "start_score": start_logits[rows, starts],
          "end_score": end_logits[rows, ends]}


def beam_candidates(start_top_log_probs: np.ndarray,
                    start_top_index: np.ndarray,
                    end_top_log_probs: np.ndarray, end_top_index: np.ndarray,
                    ex: SquadExamples, max_answer_length: int) -> dict:
  """Candidates of the beam head: [N, k] starts and [N, k·k'] ends.

  End j of start i is at i·k' + j, as the head lays them out.
  """
  n, k = start_top_index.shape
  k_end = end_top_index.shape[1] // k
  rows = np.broadcast_to(np.arange(n)[:, None, None], (n, k, k_end))
  starts = np.broadcast_to(start_top_index[:, :, None], (n, k, k_end))
  start_scores = np.broadcast_to(start_top_log_probs[:, :, None],
                                 (n, k, k_end))
  ends = end_top_index.reshape(n, k, k_end)
  end_scores = end_top_log_probs.reshape(n, k, k_end)
  keep = _valid_spans(ex, rows, starts, ends, max_answer_length)
  return {"row": rows[keep], "start": starts[keep], "end": ends[keep],
          "start_score": start_scores[keep], "end_score": end_scores[keep]}


def softmax(scores: Sequence[float]) -> list:
  """The official `_compute_softmax` (a plain Python softmax)."""
  if not scores:
    return []
  top = max(scores)
  exps = [math.exp(s - top) for s in scores]
  return [e / sum(exps) for e in exps]


def nbest_answers(cands: dict, ex: SquadExamples, n_best_size: int,
                  score_names: tuple[str, str] = ("start_logit", "end_logit"),
                  null_scores: Optional[np.ndarray] = None) -> Answers:
  """Ranks each example's candidates into its n-best list.

  Args:
    cands: from `logit_candidates` or `beam_candidates`.
    ex: the split's examples.
    n_best_size: entries kept per example.
    score_names: the entries' names for the start and end scores.
    null_scores: [E, 2] (start, end) scores of the "no answer" span to rank
      with the others (the simple v2.0 head's [CLS] span), or None.

  Returns:
    `Answers` with `best` and `nbest` (no `null_odds`).
  """
  example = ex.row_example[cands["row"]]
  total = cands["start_score"] + cands["end_score"]
  # Best total first; ties keep the generation order (a stable sort).
  order = np.lexsort((np.arange(len(total)), -total, example))
  bounds = np.searchsorted(example[order], np.arange(len(ex.ids) + 1))
  best, nbest = {}, {}
  for e, qid in enumerate(ex.ids):
    idx = order[bounds[e]:bounds[e + 1]]
    pool = ((float(cands["start_score"][i]), float(cands["end_score"][i]),
             int(cands["row"][i]), int(cands["start"][i]),
             int(cands["end"][i])) for i in idx)
    null = None
    if null_scores is not None:
      null = (float(null_scores[e, 0]), float(null_scores[e, 1]), -1, 0, 0)
      # Ranked after every candidate whose total is at least the null's.
      at = int(np.sum(total[idx] >= null[0] + null[1]))
      pool = itertools.chain(itertools.islice(pool, at), [null], pool)
    entries, seen = [], set()
    for s_score, e_score, row, s, t in pool:
      if len(entries) >= n_best_size:
        break
      text = "" if row < 0 else ex.contexts[e][
          ex.token_start[row, s]:ex.token_end[row, t]].strip()
      if text in seen:
        continue
      seen.add(text)
      entries.append({"text": text, score_names[0]: s_score,
                      score_names[1]: e_score})
    if null is not None and "" not in seen:
      entries.append({"text": "", score_names[0]: null[0],
                      score_names[1]: null[1]})
    if not entries:  # no valid span in any window
      entries.append({"text": "", score_names[0]: -1e6, score_names[1]: -1e6})
    probs = softmax([x[score_names[0]] + x[score_names[1]] for x in entries])
    nbest[qid] = [{"text": x["text"], "probability": p,
                   score_names[0]: x[score_names[0]],
                   score_names[1]: x[score_names[1]]}
                  for x, p in zip(entries, probs)]
    best[qid] = next((x["text"] for x in entries if x["text"]), "")
  return Answers(best=best, nbest=nbest)


def _best_total(entries: list, names: tuple[str, str]) -> float:
  """Total score of the first non-empty entry (-2e6 if there is none)."""
  top = next((x for x in entries if x["text"]), None)
  return -2e6 if top is None else top[names[0]] + top[names[1]]


def span_answers(start_logits: np.ndarray, end_logits: np.ndarray,
                 ex: SquadExamples, n_best_size: int, max_answer_length: int,
                 with_null: bool) -> Answers:
  """Answers of a start/end logits head (v1.1, or the simple v2.0 head).

  With `with_null`, the [CLS] span is the "no answer" span (BERT's v2.0
  rule): its score is the minimum over the example's windows of start + end
  logit at [CLS], it joins the n-best, and the null odds are that score
  minus the best non-empty span's.
  """
  cands = logit_candidates(start_logits, end_logits, ex, n_best_size,
                           max_answer_length)
  null = None
  if with_null:
    cls_total = start_logits[:, 0] + end_logits[:, 0]
    null = np.zeros((len(ex.ids), 2))
    lowest = np.full(len(ex.ids), np.inf)
    for row, e in enumerate(ex.row_example):  # first window wins ties
      if cls_total[row] < lowest[e]:
        lowest[e] = cls_total[row]
        null[e] = start_logits[row, 0], end_logits[row, 0]
  answers = nbest_answers(cands, ex, n_best_size, null_scores=null)
  if with_null:
    names = ("start_logit", "end_logit")
    answers.null_odds = {
        qid: float(null[e].sum()) - _best_total(answers.nbest[qid], names)
        for e, qid in enumerate(ex.ids)}
  return answers


def beam_answers(predictions: dict, ex: SquadExamples, n_best_size: int,
                 max_answer_length: int) -> Answers:
  """Answers of ALBERT's v2.0 head; null odds = min over windows of cls."""
  cands = beam_candidates(
      predictions["start_top_log_probs"], predictions["start_top_index"],
      predictions["end_top_log_probs"], predictions["end_top_index"], ex,
      max_answer_length)
  answers = nbest_answers(cands, ex, n_best_size,
                          score_names=("start_log_prob", "end_log_prob"))
  cls = np.full(len(ex.ids), np.inf)
  np.minimum.at(cls, ex.row_example, predictions["cls_logits"])
  answers.null_odds = {qid: float(cls[e]) for e, qid in enumerate(ex.ids)}
  return answers


# The official evaluation scripts.


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


def write_json(path: str, value) -> str:
  """Writes `value` as indented JSON (the official files' layout)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(value, indent=4, ensure_ascii=False) + "\n")
  return path
