"""Raw inputs → a fine-tuned model's features, and its outputs → predictions,
one encoder/decoder per task type.

`predict(model, items, batch_size)` is what `FineTuned.predict`
(`albert_jax.finetune.predict`) runs: it parses each input in the forms the
task type takes, featurizes them exactly as the task featurized its data,
runs `model` (a `FineTuned`: called on features, it returns the head's
outputs) and decodes the outputs into one JSON-serialisable dict per input.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from albert_jax.finetune import classification
from albert_jax.finetune import multiple_choice
from albert_jax.finetune import tagging
from albert_jax.finetune.squad import evaluate as squad_eval
from albert_jax.finetune.squad import task as squad_task


class PredictError(ValueError):
  """Inputs a fine-tuned model cannot predict on, with the fix."""


def predict(model, items: list, batch_size: int, **options) -> list[dict]:
  """One prediction dict per input of `items` (non-empty), by `model`'s
  task type; `options` are the type's (question answering:
  `null_threshold`)."""
  return _PREDICTORS[model.task_type](model, items, batch_size, **options)


def _texts(item, columns: Sequence[str]) -> tuple[str, str | None]:
  """(text, second text or None) of a classification input."""
  if isinstance(item, str):
    return item, None
  if isinstance(item, dict):
    missing = [c for c in columns if c not in item]
    if missing:
      raise PredictError(f"Input {item!r} lacks {missing}; this model reads "
                         f"{list(columns)}.")
    values = [item[c] for c in columns]
  else:
    values = list(item) if isinstance(item, tuple) else None
  if (not values or len(values) > 2
      or not all(isinstance(v, str) for v in values)):
    raise PredictError(
        f"A classification input is a text, a (text, text) pair or a dict "
        f"with {list(columns)}; got {item!r}.")
  return values[0], values[1] if len(values) > 1 else None


def _classify(model, items, batch_size: int) -> list[dict]:
  # None: a checkpoint from transformers, which takes texts and pairs.
  recorded = model.settings.get("text_columns")
  columns = recorded or ["text", "text_pair"]
  pairs = [_texts(item, columns) for item in items]
  has_b = {b is not None for _, b in pairs}
  if len(has_b) > 1:
    raise PredictError("Some inputs are pairs and some single texts; "
                       "predict them in separate calls.")
  want_pair = len(columns) == 2 if recorded else has_b == {True}
  if has_b != {want_pair}:
    raise PredictError(
        "This model was fine-tuned on "
        + ("text pairs; give (text, text) pairs." if want_pair
           else "single texts; give one text per input."))
  features = classification.encode_texts(
      model.tokenizer, [a for a, _ in pairs],
      [b for _, b in pairs] if want_pair else None, model.max_seq_length)
  logits = model(features, batch_size)["logits"].astype(np.float64)
  if model.task_type == "regression":
    return [{"score": float(row[0])} for row in logits]
  probs = _softmax(logits)
  out = []
  for p, row in zip(probs, logits):
    k = int(np.argmax(row))
    out.append({"label": model.labels[k], "probability": float(p[k]),
                "probabilities": dict(zip(model.labels, map(float, p))),
                "logits": [float(x) for x in row]})
  return out


def _softmax(x: np.ndarray) -> np.ndarray:
  """Row-wise softmax in float64. [..., K] → [..., K]."""
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _choice_record(item, settings: dict) -> dict:
  """A multiple-choice input as multiple_choice.featurize's record."""
  if isinstance(item, dict):
    context = item.get(settings.get("context_column") or "context",
                       item.get("context"))
    question = item.get(settings.get("question_column") or "question", "")
    choices = item.get("choices")
    if choices is None and settings.get("choice_columns"):
      choices = [item.get(c) for c in settings["choice_columns"]]
    if choices is None and settings.get("choices_column"):
      choices = item.get(settings["choices_column"])
  elif isinstance(item, tuple) and len(item) in (2, 3):
    context, question, choices = (item[0], "", item[1]) if len(item) == 2 \
        else item
  else:
    context = question = choices = None
  if (not isinstance(context, str) or not isinstance(question or "", str)
      or not isinstance(choices, (list, tuple)) or len(choices) < 2
      or not all(isinstance(c, str) for c in choices)):
    raise PredictError(
        "A multiple-choice input is (context, [choice, ...]), (context, "
        "question, [choice, ...]) or a dict with 'context', 'choices' and "
        f"optionally 'question'; two or more choices. Got {item!r}.")
  return {"article": context, "question": question or "",
          "options": list(choices), "label": -1}


def _choose(model, items, batch_size: int) -> list[dict]:
  records = [_choice_record(item, model.settings) for item in items]
  out: list[dict | None] = [None] * len(records)
  # Rows with the same number of choices share one [N, C, T] array.
  by_count: dict[int, list[int]] = {}
  for i, rec in enumerate(records):
    by_count.setdefault(len(rec["options"]), []).append(i)
  for indices in by_count.values():
    features = multiple_choice.featurize(
        [records[i] for i in indices], model.tokenizer, model.max_seq_length,
        model.settings.get("max_qa_length", 128))
    logits = model(features, batch_size)["logits"].astype(np.float64)
    for i, row, p in zip(indices, logits, _softmax(logits)):
      k = int(np.argmax(row))
      out[i] = {"choice": k, "answer": records[i]["options"][k],
                "probabilities": [float(x) for x in p],
                "logits": [float(x) for x in row]}
  return out


def _qa_record(i: int, item) -> dict:
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


def _answer(model, items, batch_size: int,
            null_threshold: float | None = None) -> list[dict]:
  s = model.settings
  records = [_qa_record(i, item) for i, item in enumerate(items)]
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
        s["n_best_size"], s["max_answer_length"], with_null=s["version_2"])
  if null_threshold is None:
    null_threshold = s.get("null_threshold")
  if null_threshold is None:
    null_threshold = 0.0
  names = (("start_log_prob", "end_log_prob") if s["head_kind"] == "official"
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


def _tag_input(item) -> tuple[str, list[str], list[tuple[int, int]]]:
  """(text, words, word spans) of a tagging input: a text, or a dict with
  "text" or "tokens" (words, joined with spaces)."""
  if isinstance(item, dict) and isinstance(item.get("tokens"), list):
    words = [str(w) for w in item["tokens"]]
    text = " ".join(words)
    spans, at = [], 0
    for w in words:
      spans.append((at, at + len(w)))
      at += len(w) + 1
    return text, words, spans
  text = item.get("text") if isinstance(item, dict) else item
  if not isinstance(text, str):
    raise PredictError("A tagging input is a text, or a dict with 'text' or "
                       f"'tokens' (a list of words); got {item!r}.")
  words, spans = tagging.split_words(text)
  return text, words, spans


def _tag(model, items, batch_size: int) -> list[dict]:
  parsed = [_tag_input(item) for item in items]
  features = tagging.encode_words(model.tokenizer, [p[1] for p in parsed],
                                  model.max_seq_length)
  first = features.pop("first")
  logits = model(features, batch_size)["logits"]
  tags = tagging.word_tags(np.argmax(logits, -1), first,
                           [len(p[1]) for p in parsed], model.labels)
  return [{"entities": tagging.entities(text, spans, t), "words": words,
           "tags": t} for (text, words, spans), t in zip(parsed, tags)]


_PREDICTORS = {"classification": _classify, "regression": _classify,
               "multiple_choice": _choose, "question_answering": _answer,
               "token_classification": _tag}
