"""SQuAD post-processing (n-best answer spans) and the official metrics.

A SQuAD example is read through one or more overlapping context windows (rows
of the model). Post-processing collects each example's candidate spans across
its windows as ALBERT's `squad_utils` does: a span must lie in the context,
start on a token whose window is its "max context" one, end at or after its
start and be at most `max_answer_length` tokens; candidates are ranked by
start + end score, duplicates (same text) dropped, the top `n_best_size`
kept. The answer text is the original context between the characters of the
span's first and last tokens, so no detokenisation is involved.

The official metrics (the v1.1 and v2.0 scripts, and the v2.0 no-answer
threshold tuning) are in `albert_jax.finetune.tasks.squad.official`; their names
are importable from here too.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Optional, Sequence

import numpy as np

from albert_jax import storage
from albert_jax.finetune.tasks.squad.official import f1_v1
from albert_jax.finetune.tasks.squad.official import f1_v2
from albert_jax.finetune.tasks.squad.official import find_best_thresh
from albert_jax.finetune.tasks.squad.official import normalize_answer
from albert_jax.finetune.tasks.squad.official import raw_scores_v2
from albert_jax.finetune.tasks.squad.official import squad_v1_metrics
from albert_jax.finetune.tasks.squad.official import squad_v2_metrics
from albert_jax.finetune.tasks.squad.official import tune_null_threshold

__all__ = ["Answers", "SquadExamples", "beam_answers", "beam_candidates",
           "f1_v1", "f1_v2", "find_best_thresh", "logit_candidates",
           "nbest_answers", "normalize_answer", "raw_scores_v2", "softmax",
           "span_answers", "squad_v1_metrics", "squad_v2_metrics",
           "top_indexes", "tune_null_threshold", "write_json"]


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
    offsets: the context characters [start, end) of each n-best entry's
      text, in n-best order ((0, 0) for the empty "no answer" text); kept
      out of the files, which hold the official fields only.
  """
  best: dict
  nbest: dict
  null_odds: Optional[dict] = None
  offsets: Optional[dict] = None


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
  best, nbest, offsets = {}, {}, {}
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
    entries, seen, spans = [], set(), []
    for s_score, e_score, row, s, t in pool:
      if len(entries) >= n_best_size:
        break
      span = (0, 0) if row < 0 else _stripped(
          ex.contexts[e], int(ex.token_start[row, s]),
          int(ex.token_end[row, t]))
      text = ex.contexts[e][span[0]:span[1]]
      if text in seen:
        continue
      seen.add(text)
      spans.append(span)
      entries.append({"text": text, score_names[0]: s_score,
                      score_names[1]: e_score})
    if null is not None and "" not in seen:
      spans.append((0, 0))
      entries.append({"text": "", score_names[0]: null[0],
                      score_names[1]: null[1]})
    if not entries:  # no valid span in any window
      spans.append((0, 0))
      entries.append({"text": "", score_names[0]: -1e6, score_names[1]: -1e6})
    offsets[qid] = spans
    probs = softmax([x[score_names[0]] + x[score_names[1]] for x in entries])
    nbest[qid] = [{"text": x["text"], "probability": p,
                   score_names[0]: x[score_names[0]],
                   score_names[1]: x[score_names[1]]}
                  for x, p in zip(entries, probs)]
    best[qid] = next((x["text"] for x in entries if x["text"]), "")
  return Answers(best=best, nbest=nbest, offsets=offsets)


def _stripped(context: str, start: int, end: int) -> tuple[int, int]:
  """[start, end) narrowed past surrounding whitespace: the characters of
  `context[start:end].strip()`."""
  text = context[start:end]
  lead = len(text) - len(text.lstrip())
  return start + lead, start + lead + len(text.strip())


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


def write_json(path: str, value) -> str:
  """Writes `value` as indented JSON (the official files' layout) to `path`
  (local or gs://); returns `path`."""
  storage.path(path).parent.mkdir(parents=True, exist_ok=True)
  storage.write_atomic(path, json.dumps(value, indent=4, ensure_ascii=False)
                       + "\n")
  return path
