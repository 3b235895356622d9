"""Text → the encoder's input ids, for `Pretrained.fill_mask` and
`Pretrained.embed` (`albert_jax.interop.pretrained`)."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np


def mask_input_ids(tokenizer, text: str,
                   limit: int) -> tuple[list[int], np.ndarray]:
  """`[CLS] text [SEP]` ids with each mask marker ("[MASK]", or the
  vocabulary's own mask piece such as "<mask>") as the mask id, and the
  masks' positions [num_masks].

  Raises:
    ValueError: no tokenizer, one without a mask, [CLS] or [SEP] piece, a
      text that is not a str or has no mask marker, or more than `limit`
      ids.
  """
  tok = tokenizer
  if tok is None:
    raise ValueError(
        "fill_mask needs the checkpoint's tokenizer, and this one has no "
        "vocabulary file; set `.tokenizer = Tokenizer.from_file(...)` "
        "(albert_jax.text.tokenizer) to its spiece.model, vocab.txt or "
        "tokenizer.json first.")
  mask_id = tok.mask_id
  if mask_id is None:  # RoBERTa-style vocabularies spell it "<mask>".
    i = tok.piece_to_id("<mask>")
    mask_id = i if i is not None and tok.id_to_piece(i) == "<mask>" else None
  if mask_id is None or tok.cls_id is None or tok.sep_id is None:
    raise ValueError(
        f"The tokenizer ({tok.path or 'in memory'}) lacks a mask, [CLS] or "
        "[SEP] piece (ids: mask "
        f"{mask_id}, cls {tok.cls_id}, sep {tok.sep_id}), so it cannot "
        "build masked-LM inputs; use the checkpoint's own ALBERT/BERT "
        "vocabulary.")
  if not isinstance(text, str):
    raise ValueError(f"fill_mask takes one text (str); got "
                     f"{type(text).__name__}.")
  piece = tok.id_to_piece(mask_id)
  markers = sorted({"[MASK]", piece}, key=len, reverse=True)
  parts = re.split("|".join(map(re.escape, markers)), text)
  if len(parts) == 1:
    raise ValueError(
        f"The text has no mask marker: write {piece!r} where a token should "
        f"be predicted, e.g. 'The capital of France is {piece}.'; got "
        f"{text!r}.")
  ids, positions = [tok.cls_id], []
  for i, part in enumerate(parts):
    if i:
      positions.append(len(ids))
      ids.append(mask_id)
    ids += tok.encode(part)
  ids.append(tok.sep_id)
  if len(ids) > limit:
    raise ValueError(
        f"The text encodes to {len(ids)} tokens with [CLS] and [SEP], more "
        f"than the model's {limit} positions; shorten it.")
  return ids, np.asarray(positions, np.int64)


def encode_pairs(tokenizer, items: Sequence,
                 limit: int) -> list[dict[str, list[int]]]:
  """`[CLS] a [SEP] (b [SEP])` encodings of texts or (text, text) pairs.

  Raises:
    ValueError: an input that encodes to more than `limit` ids.
  """
  encoded = []
  for item in items:
    a, b = (item, None) if isinstance(item, str) else item
    enc = tokenizer.encode_pair(a, b)
    if len(enc["input_ids"]) > limit:
      raise ValueError(f"An input encodes to {len(enc['input_ids'])} "
                       f"tokens, more than the model's {limit} positions; "
                       "shorten it.")
    encoded.append(enc)
  return encoded


def pad_rows(rows: Sequence[dict[str, list[int]]], pad_id: int,
             limit: int) -> dict[str, np.ndarray]:
  """Encodings as "input_ids" (padded with `pad_id`), "token_type_ids" and
  "attention_mask" (padded with 0), each [N, T] int32: T is the longest
  row rounded up to a multiple of 32 tokens (so similar lengths share one
  compiled forward), at most `limit`."""
  length = min(limit, -(-max(len(r["input_ids"]) for r in rows) // 32)
               * 32)
  return {k: np.asarray([r[k] + [fill] * (length - len(r[k]))
                         for r in rows], np.int32)
          for k, fill in (("input_ids", pad_id), ("token_type_ids", 0),
                          ("attention_mask", 0))}
