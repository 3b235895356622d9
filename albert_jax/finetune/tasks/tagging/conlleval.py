"""Entity-level precision, recall and F1 exactly as CoNLL's `conlleval` script.

The script (conlleval.pl, CoNLL-2000, used unchanged for CoNLL-2003) reads
one tag per token, "B-TYPE", "I-TYPE", "E-TYPE" or "O", and finds chunks
with its `startOfChunk` / `endOfChunk` rules, so IOB1 (a chunk may start
with I-), IOB2 and IOE tags are all read as the script reads them. A chunk
is correct when the guessed and the gold chunk start at the same token, end
at the same token and have the same type. Sentences are scored as if an
"O" separated them (the script's boundary lines), so no chunk spans two.

Precision = correct / guessed chunks, recall = correct / gold chunks, F1 =
2PR / (P + R); each 0 when its denominator is. The script prints
percentages; these are fractions.
"""

from __future__ import annotations

from typing import Sequence


def split_tag(tag: str) -> tuple[str, str]:
  """("B", "PER") from "B-PER"; ("O", "") from "O"."""
  prefix, _, kind = tag.partition("-")
  return prefix, kind


def end_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
  """conlleval's `endOfChunk`: whether a chunk ended just before this
  token."""
  pair = (prev_tag, tag)
  if pair in (("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"),
              ("E", "I"), ("E", "O")):
    return True
  if prev_tag not in ("O", ".") and prev_type != kind:
    return True
  return prev_tag in ("]", "[")


def start_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str
                   ) -> bool:
  """conlleval's `startOfChunk`: whether a chunk starts at this token."""
  pair = (prev_tag, tag)
  if pair in (("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"),
              ("E", "I"), ("O", "E")):
    return True
  if tag not in ("O", ".") and prev_type != kind:
    return True
  return tag in ("[", "]")


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """The chunks of one sentence: (type, first token, last token + 1)."""
  out, start = [], None
  prev_tag, prev_type = "O", ""
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, kind = split_tag(tag)
    if start is not None and end_of_chunk(prev_tag, prefix, prev_type, kind):
      out.append((prev_type, start, i))
      start = None
    if i < len(tags) and start_of_chunk(prev_tag, prefix, prev_type, kind):
      start = i
    prev_tag, prev_type = prefix, kind
  return out


def evaluate(gold: Sequence[Sequence[str]], guessed: Sequence[Sequence[str]]
             ) -> dict[str, float]:
  """conlleval's scores of guessed tag sentences against the gold ones.

  Args:
    gold: the gold tags, one list per sentence.
    guessed: the predicted tags, the same shape.

  Returns:
    "precision", "recall", "f1" over all chunks, "accuracy" (tokens whose
    tag is right) and per chunk type "precision_T", "recall_T", "f1_T".

  Raises:
    ValueError: the two differ in sentences or in a sentence's length.
  """
  if len(gold) != len(guessed):
    raise ValueError(f"{len(gold)} gold sentences but {len(guessed)} "
                     "guessed ones.")
  correct, found_gold, found_guessed = {}, {}, {}
  tokens = right = 0
  for n, (gold_tags, guess_tags) in enumerate(zip(gold, guessed)):
    if len(gold_tags) != len(guess_tags):
      raise ValueError(f"Sentence {n}: {len(gold_tags)} gold tags but "
                       f"{len(guess_tags)} guessed ones.")
    in_correct = False
    last_c, last_ct, last_g, last_gt = "O", "", "O", ""
    # The script's boundary line after each sentence reads as an "O".
    for i, (c_tag, g_tag) in enumerate(list(zip(gold_tags, guess_tags))
                                       + [("O", "O")]):
      c, ct = split_tag(c_tag)
      g, gt = split_tag(g_tag)
      c_end = end_of_chunk(last_c, c, last_ct, ct)
      g_end = end_of_chunk(last_g, g, last_gt, gt)
      if in_correct:
        if c_end and g_end and last_gt == last_ct:
          in_correct = False
          correct[last_ct] = correct.get(last_ct, 0) + 1
        elif c_end != g_end or gt != ct:
          in_correct = False
      c_start = start_of_chunk(last_c, c, last_ct, ct)
      g_start = start_of_chunk(last_g, g, last_gt, gt)
      if c_start and g_start and gt == ct:
        in_correct = True
      if c_start:
        found_gold[ct] = found_gold.get(ct, 0) + 1
      if g_start:
        found_guessed[gt] = found_guessed.get(gt, 0) + 1
      if i < len(gold_tags):
        tokens += 1
        right += c_tag == g_tag
      last_c, last_ct, last_g, last_gt = c, ct, g, gt
  out = _prf(sum(correct.values()), sum(found_guessed.values()),
             sum(found_gold.values()))
  out["accuracy"] = right / tokens if tokens else 0.0
  for kind in sorted(set(found_gold) | set(found_guessed)):
    for k, v in _prf(correct.get(kind, 0), found_guessed.get(kind, 0),
                     found_gold.get(kind, 0)).items():
      out[f"{k}_{kind}"] = v
  return out


def _prf(correct: int, guessed: int, gold: int) -> dict[str, float]:
  precision = correct / guessed if guessed else 0.0
  recall = correct / gold if gold else 0.0
  f1 = (2 * precision * recall / (precision + recall)
        if precision + recall else 0.0)
  return {"precision": precision, "recall": recall, "f1": f1}
