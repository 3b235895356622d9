"""The models SQuAD fine-tunes, reloaded: `QUESTION_ANSWERING`.

(question, context) → {"answer", "start", "end", "probability", "score"}
(characters [start, end) of the context), and for v2.0-style heads
"null_odds" and "no_answer". The context is cut into windows and the
answers read back exactly as the task does for its eval split
(`squad.task.featurize`, `squad.evaluate`).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import numpy as np

from albert_jax.finetune import task_type as task_type_lib
from albert_jax.finetune.task_type import PredictError
from albert_jax.finetune.tasks.squad import evaluate as squad_eval
from albert_jax.finetune.tasks.squad import head as squad_head
from albert_jax.finetune.tasks.squad import task as squad_task
from albert_jax.model.config import ModelConfig


def _record(i: int, item) -> dict:
  """A question-answering input as `squad.task.featurize`'s record."""
  if isinstance(item, dict):
    question, context = item.get("question"), item.get("context")
  elif isinstance(item, tuple) and len(item) == 2:
    question, context = item
  else:
    question = context = None
  if not isinstance(question, str) or not isinstance(context, str):
    raise PredictError("A question-answering input is (question, context) "
                       "or a dict with 'question' and 'context'; got "
                       f"{item!r}.")
  return {"id": str(i), "question": question, "context": context,
          "answers": [], "answer_starts": [], "is_impossible": False}


class QuestionAnsweringType(task_type_lib.TaskType):
  """A fine-tuned SQuAD model: the span head, or ALBERT's official v2.0
  head.

  Its task.json: "head_kind" ("span", or `squad.task.V2_HEADS`),
  "version_2", the official head's "start_n_top" and "end_n_top", the
  featurization's "doc_stride" and "max_query_length", the answers'
  "n_best_size" and "max_answer_length", and v2.0's tuned
  "null_threshold".
  """
  name = "question_answering"
  pooled = False
  hf_head = "qa_outputs"
  hf_class = "ForQuestionAnswering"

  def task_info_problem(self, info: dict) -> str | None:
    kinds = squad_task.V2_HEADS + ("span",)
    if info.get("head_kind") not in kinds:
      return f"head_kind {info.get('head_kind')!r} is not one of {kinds}"
    t = info["max_seq_length"]
    for key in ("start_n_top", "end_n_top"):
      value = info.get(key)
      if info.get("head_kind") == "official" and not (
          isinstance(value, int) and not isinstance(value, bool)
          and 1 <= value <= t):
        return f"{key} {value!r} is not a whole number in [1, {t}]"
    return None

  def head(self, info: dict, cfg: ModelConfig) -> nn.Module:
    if info["head_kind"] == "official":
      return squad_head.AlbertV2Head(cfg, info["start_n_top"],
                                     info["end_n_top"])
    return squad_head.SpanHead(cfg)

  def features(self, max_seq_length: int):
    """INPUT_KEYS and "p_mask" (bool) [T]."""
    return {**super().features(max_seq_length),
            "p_mask": ((max_seq_length,), np.bool_)}

  def predict(self, model, items: list, batch_size: int,
              null_threshold: float | None = None) -> list[dict]:
    """`null_threshold`: v2.0 heads drop an answer whose null odds exceed
    it (default: the threshold the run tuned on its eval split, else 0)."""
    s = model.settings
    records = [_record(i, item) for i, item in enumerate(items)]
    features, examples, _ = squad_task.featurize(
        records, model.tokenizer, model.max_seq_length, s["doc_stride"],
        s["max_query_length"])
    outputs = model(features, batch_size)
    if s["head_kind"] == "official":
      answers = squad_eval.beam_answers(outputs, examples, s["n_best_size"],
                                        s["max_answer_length"])
    else:
      answers = squad_eval.span_answers(
          outputs["start_logits"], outputs["end_logits"], examples,
          s["n_best_size"], s["max_answer_length"],
          with_null=s["version_2"])
    if null_threshold is None:
      null_threshold = s.get("null_threshold")
    if null_threshold is None:
      null_threshold = 0.0
    names = (("start_log_prob", "end_log_prob")
             if s["head_kind"] == "official"
             else ("start_logit", "end_logit"))
    out = []
    for rec in records:
      qid = rec["id"]
      nbest = answers.nbest[qid]
      k = next((j for j, x in enumerate(nbest) if x["text"]), None)
      entry = {"answer": "", "start": None, "end": None, "probability": 0.0,
               "score": None}
      if k is not None:
        start, end = answers.offsets[qid][k]
        entry.update(answer=nbest[k]["text"], start=int(start), end=int(end),
                     probability=float(nbest[k]["probability"]),
                     score=float(nbest[k][names[0]] + nbest[k][names[1]]))
      if answers.null_odds is not None:
        odds = float(answers.null_odds[qid])
        entry["null_odds"] = odds
        entry["no_answer"] = k is None or odds > null_threshold
        if entry["no_answer"]:
          entry.update(answer="", start=None, end=None)
      out.append(entry)
    return out

  def file_input(self, row: dict, settings: dict,
                 columns: Sequence[str] | None):
    """The question and the context from `columns`, else the row
    ("question" and "context")."""
    if columns:
      return {"question": row.get(columns[0]),
              "context": row.get(columns[1])}
    return row

  def check_export(self, settings: dict) -> None:
    if settings.get("head_kind") == "official":
      raise ValueError(
          "This model has ALBERT's official SQuAD v2.0 head (start logits, "
          "end logits conditioned on the start, and an answer-class logit), "
          "which no transformers class holds; AlbertForQuestionAnswering is "
          "the plain span head. Fine-tune with --config.data.v2_head=simple "
          "to export.")

  def imported_settings(self) -> dict:
    """The span head, read as the squad tasks' defaults read it."""
    return {"head_kind": "span", "version_2": False, "start_n_top": 5,
            "end_n_top": 5, "doc_stride": 128, "max_query_length": 64,
            "n_best_size": 20, "max_answer_length": 30,
            "null_threshold": None}


QUESTION_ANSWERING = QuestionAnsweringType()
