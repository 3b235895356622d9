"""SQuAD v1.1 and v2.0 as fine-tuning tasks: features, heads, metrics, files.

Features follow ALBERT's `squad_utils.convert_examples_to_features`: each
question becomes one row per context window, `[CLS] query [SEP] window [SEP]`
(token types 0 up to the first [SEP], then 1), windows `doc_stride` tokens
apart. Training labels are the answer's start/end token positions, or 0
([CLS]) with `is_impossible` = 1 when the question has no answer or the
answer is not inside the window. Tokens map to context characters through
`Tokenizer.encode_with_offsets`, so answers are read back from the original
context. The first gold answer gives the labels; evaluation scores against
all of them. An answer whose text is not at its answer_start (none in TFDS's
SQuAD 3.0.0) cannot be placed: its rows are labelled like an answer outside
the window ([CLS], `is_impossible`), with a warning.

`make_task("squad/v1.1" | "squad/v2.0", data)` reads these `config.data` keys:
  tfds_data_dir (None): TFDS data directory, local or gs:// (None:
    TFDS's default).
  tfds_download (True): let TFDS download and prepare a missing dataset.
  doc_stride (128): tokens between the starts of consecutive windows.
  max_query_length (64): query tokens kept (the first ones).
  n_best_size (20): starts/ends per window and answers kept per question.
  max_answer_length (30): longest answer in tokens.
  v2_head ("official"): SQuAD v2.0 head, "official" (ALBERT's
    answer-class + beam head) or "simple" (span head; [CLS] = no answer).
  start_n_top (5), end_n_top (5): the "official" head's inference beam.
The sequence length is the loop's `data.max_seq_length` (384 officially).

Metrics are the official scripts' (v1.1 exact_match/f1; v2.0 exact/f1 with
HasAns/NoAns and best thresholds), "f1" selecting the best checkpoint. The
v2.0 no-answer threshold is tuned on the evaluated split (`best_f1_thresh`)
and the written predictions use it. Files: predictions.json,
nbest_predictions.json and, for v2.0, null_odds.json.
"""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import storage
from albert_jax.finetune.task import Split
from albert_jax.finetune.task import Task
from albert_jax.finetune.tasks.squad import evaluate as squad_eval
from albert_jax.finetune.tasks.squad import head as squad_head
from albert_jax.finetune.tasks.squad import official
from albert_jax.finetune.tfds_source import TfdsSource

TASKS = ("squad/v1.1", "squad/v2.0")
V2_HEADS = ("official", "simple")


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_tfds(name: str, split: str, source: TfdsSource) -> list[dict]:
  """SQuAD records from TFDS `source`: id, context, question, answers,
  answer_starts and is_impossible (always False for v1.1)."""
  out = []
  for ex in source.examples(name, split):
    answers = ex["answers"]
    out.append({
        "id": _text(ex["id"]), "context": _text(ex["context"]),
        "question": _text(ex["question"]),
        "answers": [_text(a) for a in answers["text"]],
        "answer_starts": [int(s) for s in answers["answer_start"]],
        "is_impossible": bool(ex.get("is_impossible", False))})
  return out


def doc_windows(num_tokens: int, max_tokens: int,
                stride: int) -> list[tuple[int, int]]:
  """The official sliding windows (start, length) over the context tokens.

  An empty context still gets one (empty) window, so every question has a
  row to predict from.
  """
  spans, start = [], 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens)
    spans.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, stride)
  return spans or [(0, 0)]


def max_context_window(spans: list, num_tokens: int) -> np.ndarray:
  """[num_tokens] index of each token's max-context window.

  The official `_check_is_max_context` score: min(left, right context) +
  0.01 · window length; the first window wins ties.
  """
  best = np.full(num_tokens, -1)
  best_score = np.full(num_tokens, -np.inf)
  for i, (start, length) in enumerate(spans):
    pos = np.arange(start, start + length)
    score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
    better = score > best_score[pos]
    best[pos[better]], best_score[pos[better]] = i, score[better]
  return best


def answer_token_span(offsets: np.ndarray, start_char: int, end_char: int):
  """First and last token ([n, 2] char offsets) overlapping the characters
  [start_char, end_char), or None if no token does."""
  hits = np.flatnonzero((offsets[:, 0] < end_char) &
                        (offsets[:, 1] > start_char))
  return (int(hits[0]), int(hits[-1])) if len(hits) else None


def window_rows(head: list, context_ids: list, offsets: np.ndarray,
                spans: list, answer, max_seq_length: int, sep_id: int,
                pad_id: int) -> dict[str, np.ndarray]:
  """One question's rows, one per window.

  Args:
    head: `[CLS] query [SEP]` ids.
    context_ids: the context's token ids; `offsets` [len, 2] their
      characters.
    spans: the windows, (start, length) in context tokens.
    answer: (first, last) context token of the answer, or None.
    max_seq_length: T.
    sep_id, pad_id: the closing [SEP] and the padding id.

  Returns:
    [W, T] "input_ids", "token_type_ids", "attention_mask" (int32), "p_mask"
    (bool), "token_start", "token_end" (int32, -1 off the context),
    "max_context" (bool); [W] int32 "start_positions", "end_positions",
    "is_impossible".
  """
  w, t, h = len(spans), max_seq_length, len(head)
  best = max_context_window(spans, len(context_ids))
  out = {"input_ids": np.full((w, t), pad_id, np.int32),
         "token_type_ids": np.zeros((w, t), np.int32),
         "attention_mask": np.zeros((w, t), np.int32),
         "p_mask": np.ones((w, t), bool),
         "token_start": np.full((w, t), -1, np.int32),
         "token_end": np.full((w, t), -1, np.int32),
         "max_context": np.zeros((w, t), bool),
         "start_positions": np.zeros(w, np.int32),
         "end_positions": np.zeros(w, np.int32)}
  for i, (start, length) in enumerate(spans):
    n = h + length + 1
    doc, ctx = slice(start, start + length), slice(h, n - 1)
    out["input_ids"][i, :n] = head + context_ids[doc] + [sep_id]
    out["token_type_ids"][i, h:n] = 1
    out["attention_mask"][i, :n] = 1
    out["p_mask"][i, 0] = out["p_mask"][i, ctx] = False  # [CLS], context
    out["token_start"][i, ctx] = offsets[doc, 0]
    out["token_end"][i, ctx] = offsets[doc, 1]
    out["max_context"][i, ctx] = best[doc] == i
    if answer is not None and start <= answer[0] and (
        answer[1] < start + length):
      out["start_positions"][i] = answer[0] - start + h
      out["end_positions"][i] = answer[1] - start + h
  # Out of the window or unanswerable: the [CLS] span.
  out["is_impossible"] = (out["start_positions"] == 0).astype(np.int32)
  return out


def featurize(records: list[dict], tokenizer, max_seq_length: int,
              doc_stride: int, max_query_length: int,
              ) -> tuple[dict, squad_eval.SquadExamples, int]:
  """Turns records into window rows.

  Returns:
    (features, examples, misplaced): features "input_ids",
    "token_type_ids", "attention_mask" [N, T] int32, "p_mask" [N, T] bool,
    "start_positions", "end_positions", "is_impossible" [N] int32; the
    examples of the rows (for evaluation); the number of questions whose
    answer text is not at its answer_start in the context.
  """
  cls_id, sep_id, pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
  if cls_id is None or sep_id is None:
    raise ValueError("SQuAD inputs need [CLS] and [SEP] pieces; this "
                     "vocabulary has none (train one with albert_jax.text.train_tokenizer).")
  pad_id = 0 if pad_id is None else pad_id
  # Questions on one context are featurized together, tokenizing it once.
  by_context = {}
  for rec in records:
    by_context.setdefault(rec["context"], []).append(rec)
  questions, parts, misplaced = [], [], 0
  for context, group in by_context.items():
    ids, offsets = tokenizer.encode_with_offsets(context)
    offsets = np.asarray(offsets, np.int32).reshape(-1, 2)
    for rec in group:
      query = tokenizer.encode(rec["question"])[:max_query_length]
      max_tokens = max_seq_length - len(query) - 3
      if max_tokens < 1:
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for the "
            f"context after a {len(query)}-token query; raise "
            "max_seq_length or lower data.max_query_length.")
      answer = None  # (first, last) context token of the first answer
      if not rec["is_impossible"] and rec["answers"]:
        text, start = rec["answers"][0], rec["answer_starts"][0]
        if start >= 0 and (context[start:start + len(text)].split() ==
                           text.split()):
          answer = answer_token_span(offsets, start, start + len(text))
        misplaced += answer is None
      rows = window_rows([cls_id] + query + [sep_id], ids, offsets,
                         doc_windows(len(ids), max_tokens, doc_stride),
                         answer, max_seq_length, sep_id, pad_id)
      rows["row_example"] = np.full(len(rows["start_positions"]),
                                    len(questions), np.int32)
      questions.append(rec)
      parts.append(rows)
  if not parts:  # nothing usable: zero rows of the right shapes
    parts = [window_rows([], [], np.zeros((0, 2), np.int32), [], None,
                         max_seq_length, sep_id, pad_id)]
    parts[0]["row_example"] = np.zeros(0, np.int32)
  cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  features = {k: cols[k] for k in (
      "input_ids", "token_type_ids", "attention_mask", "p_mask",
      "start_positions", "end_positions", "is_impossible")}
  examples = squad_eval.SquadExamples(
      ids=[r["id"] for r in questions],
      contexts=[r["context"] for r in questions],
      answers=[[] if r["is_impossible"] else list(r["answers"])
               for r in questions],
      row_example=cols["row_example"], token_start=cols["token_start"],
      token_end=cols["token_end"], max_context=cols["max_context"])
  return features, examples, misplaced


class SquadTask(Task):
  """SQuAD v1.1 / v2.0 with the official post-processing and metrics."""
  metric = "f1"
  train_split = "train"
  eval_splits = ("validation",)
  predict_splits = ("validation",)

  def __init__(self, name: str, data):
    if name not in TASKS:
      raise ValueError(f"Unknown SQuAD task {name!r}; choose one of {TASKS}.")
    self.name = name
    self.version_2 = name == "squad/v2.0"
    get = data.get
    self.source = TfdsSource.from_data(data)
    self.doc_stride = get("doc_stride", 128)
    self.max_query_length = get("max_query_length", 64)
    self.n_best_size = get("n_best_size", 20)
    self.max_answer_length = get("max_answer_length", 30)
    self.start_n_top = get("start_n_top", 5)
    self.end_n_top = get("end_n_top", 5)
    for key in ("doc_stride", "max_query_length", "n_best_size",
                "max_answer_length", "start_n_top", "end_n_top"):
      value = getattr(self, key)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"data.{key} must be a positive integer, got "
                         f"{value!r}.")
    v2_head = get("v2_head", "official")
    if v2_head not in V2_HEADS:
      raise ValueError(f"data.v2_head={v2_head!r}; choose one of {V2_HEADS}.")
    self.head_kind = v2_head if self.version_2 else "span"
    # v2.0: the no-answer threshold of the last evaluation (`describe`).
    self.null_threshold = None

  def load(self, split: str, tokenizer, max_seq_length: int) -> Split:
    records = read_tfds(self.name, split, self.source)
    if not records:
      raise ValueError(f"TFDS {self.name} split {split!r} is empty.")
    features, examples, misplaced = featurize(
        records, tokenizer, max_seq_length, self.doc_stride,
        self.max_query_length)
    if misplaced:
      warnings.warn(f"{self.name} {split}: the answer text of {misplaced} of "
                    f"{len(records)} questions is not at its answer_start in "
                    "the context; their rows are labelled [CLS] (no answer "
                    "in the window).", stacklevel=2)
    # Training needs no answer-reading data.
    training = split == self.train_split
    return Split(name=split, features=features,
                 examples=None if training else examples)

  def batch_features(self, max_seq_length: int):
    """INPUT_KEYS and "p_mask" (bool) [T]; "start_positions",
    "end_positions" and "is_impossible" [] int32."""
    return {**super().batch_features(max_seq_length),
            "p_mask": ((max_seq_length,), np.bool_),
            **{k: ((), np.int32) for k in (
                "start_positions", "end_positions", "is_impossible")}}

  def head(self, model_config):
    if self.head_kind == "official":
      return squad_head.AlbertV2Head(model_config, self.start_n_top,
                                     self.end_n_top)
    return squad_head.SpanHead(model_config)

  def loss_sums(self, outputs: dict, batch: dict) -> dict:
    """Official loss sums; "correct_sum" counts rows whose argmax start and
    end are both the gold ones (shown as the training "accuracy")."""
    w = batch["weights"].astype(jnp.float32)
    loss = squad_head.span_loss(outputs, batch)
    if self.head_kind == "official":
      loss = loss + 0.5 * squad_head.answer_class_loss(outputs, batch)
    correct = ((jnp.argmax(outputs["start_logits"], -1) ==
                batch["start_positions"]) &
               (jnp.argmax(outputs["end_logits"], -1) ==
                batch["end_positions"]))
    # where(): a zero-weight row's loss must not turn into NaN·0.
    return {"loss_sum": jnp.sum(jnp.where(w > 0, loss, 0.0) * w),
            "correct_sum": jnp.sum(w * correct.astype(jnp.float32))}

  def predict(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    if self.head_kind != "official":
      return {"start_logits": outputs["start_logits"],
              "end_logits": outputs["end_logits"]}
    keys = ("start_top_log_probs", "start_top_index", "end_top_log_probs",
            "end_top_index", "cls_logits")
    return {k: outputs[k] for k in keys}

  def answers(self, predictions: dict, split: Split) -> squad_eval.Answers:
    """Post-processed n-best answers (and v2.0 null odds) of a split."""
    ex = split.examples
    if self.head_kind == "official":
      return squad_eval.beam_answers(predictions, ex, self.n_best_size,
                                     self.max_answer_length)
    return squad_eval.span_answers(
        np.asarray(predictions["start_logits"]),
        np.asarray(predictions["end_logits"]), ex, self.n_best_size,
        self.max_answer_length, with_null=self.version_2)

  def _final(self, answers: squad_eval.Answers, split: Split):
    """(metrics, final predictions) of a split; v2.0 tunes the threshold."""
    golds = dict(zip(split.examples.ids, split.examples.answers))
    if not self.version_2:
      return official.squad_v1_metrics(answers.best, golds), answers.best
    self.null_threshold = official.null_threshold(
        answers.best, answers.null_odds, golds)
    return official.tune_null_threshold(answers.best, answers.null_odds,
                                          golds)

  def describe(self) -> dict:
    """The head and featurization settings; for v2.0 also the no-answer
    threshold tuned by the last evaluation (the one the prediction files
    use), None before any."""
    return {"task_type": "question_answering", "labels": None,
            "head_kind": self.head_kind, "version_2": self.version_2,
            "start_n_top": self.start_n_top, "end_n_top": self.end_n_top,
            "doc_stride": self.doc_stride,
            "max_query_length": self.max_query_length,
            "n_best_size": self.n_best_size,
            "max_answer_length": self.max_answer_length,
            "null_threshold": self.null_threshold}

  def evaluate(self, predictions: dict, split: Split) -> dict[str, float]:
    metrics, _ = self._final(self.answers(predictions, split), split)
    return metrics

  def write_predictions(self, predictions: dict, split: Split,
                        directory: str) -> list[str]:
    answers = self.answers(predictions, split)
    _, final = self._final(answers, split)
    root = storage.path(directory)
    paths = [squad_eval.write_json(os.fspath(root / name), value)
             for name, value in (("predictions.json", final),
                                 ("nbest_predictions.json", answers.nbest))]
    if self.version_2:
      paths.append(squad_eval.write_json(
          os.fspath(root / "null_odds.json"), answers.null_odds))
    return paths


def make_task(name: str, data) -> SquadTask:
  """The SQuAD task `name` ("squad/v1.1" or "squad/v2.0")."""
  return SquadTask(name, data)
