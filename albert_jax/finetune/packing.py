"""Padding-free fine-tuning: several examples in one row (`config.data.pack`).

A fine-tuning row padded to `max_seq_length` is mostly padding when the
texts are short (the bundled corpus-source task: about 30 of 128 positions
are text). `pack` puts up to K right-padded examples side by side in one
row, each keeping its own [CLS], token types and segment id (1..K in
"attention_mask": a token attends only to its own example,
`albert_jax.ops.attention`; the model counts each example's positions from
its own start, as its positions alone, `encoder.segment_position_ids`);
"cls_positions" [K] tells the model where each example's [CLS] is, so the
pooler and a sentence head give one output per example ([R, K, ...]).
Per-example features (a class label) become [R, K] slots; per-token ones
(a tagger's labels, named by the task's `token_keys`) are laid out as the
tokens are. "slot_weights" [R, K] is 1 for a filled slot and "slot_index"
[R, K] names the example a slot holds (-1: empty), which `unpack` uses to
put the predictions back in the examples' order: a slot's output, or an
example's tokens' outputs (`token_slots` tells a loss which example a
token belongs to).

Rows are filled best-fit decreasing: the longest example first, each into
the open row it fills most tightly, else a new row; deterministic, and
about linear in the number of examples (open rows are kept by free space,
a bitmask finds the tightest in one step). Rows come longest-first; the
training batches shuffle them (`batching.PackedBatches`), and predictions
go back to the examples' order (`unpack`).
A packed batch's loss is the mean over its real examples, as an unpacked
batch's is; `example_weights` gives the weights every sum uses.
`batch_size` still counts examples: a training step takes the packed rows
that hold that many on average (`data.instances.rows_per_step`), so a run's
steps, epochs and learning rate mean what they mean unpacked, and its steps
are cheaper.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Input features: [T] per example, concatenated into rows.
TOKEN_KEYS = ("input_ids", "token_type_ids", "attention_mask")
# What packing adds to a row.
CLS, SLOT_WEIGHTS, SLOT_INDEX = ("cls_positions", "slot_weights",
                                 "slot_index")
MAX_PER_ROW = 255
# K where `config.data.pack` is unset and the task packs: room for short
# texts (the bundled task's rows hold about 4 at seq 128; GLUE's
# single-sentence tasks more at 512) at a [K]-slot head that costs nothing.
DEFAULT_PER_ROW = 8


def check_pack(pack: Any) -> int | None:
  """`config.data.pack` as K (0: one example per row; None: unset, i.e.
  `DEFAULT_PER_ROW` where the task packs, `resolve`).

  Raises:
    ValueError: not None, 0 or a whole number in [2, MAX_PER_ROW].
  """
  if pack is None:
    return None
  if isinstance(pack, bool) or not isinstance(pack, int) or not (
      pack == 0 or 2 <= pack <= MAX_PER_ROW):
    raise ValueError(
        f"config.data.pack={pack!r} must be 0 (one example per row) or K in "
        f"[2, {MAX_PER_ROW}] examples per row, e.g. --config.data.pack=8.")
  return pack


def resolve(pack: int | None, packable: bool) -> int:
  """K for a model whose rows can (`packable`) or cannot hold several
  examples: `pack` as given, or unset (None) `DEFAULT_PER_ROW` where rows
  pack and 0 where they do not. An explicit K where rows cannot pack is
  the caller's to refuse."""
  if pack is None:
    return DEFAULT_PER_ROW if packable else 0
  return pack


def packed_features(features: dict[str, tuple[tuple[int, ...], Any]],
                    per_row: int, token_keys: tuple[str, ...] = ()
                    ) -> dict[str, tuple[tuple[int, ...], Any]]:
  """A task's per-row feature schema (`Task.batch_features`) packed K to a
  row: TOKEN_KEYS and `token_keys` stay [T, ...], per-example features gain
  a leading [K], and the packing features are added."""
  length = features["input_ids"][0]
  if len(length) != 1:
    raise ValueError("Only rows of one sequence pack; multiple-choice rows "
                     f"({features['input_ids'][0][:-1]} sequences) do not.")
  (t,) = length
  out = {}
  for name, (shape, dtype) in features.items():
    out[name] = (shape, dtype) if name in TOKEN_KEYS + tuple(token_keys) else (
        (per_row,) + tuple(shape), dtype)
  out[CLS] = ((per_row,), np.int32)
  out[SLOT_WEIGHTS] = ((per_row,), np.float32)
  out[SLOT_INDEX] = ((per_row,), np.int32)
  return out


def _assign(lengths: np.ndarray, t: int, per_row: int
            ) -> list[list[int]]:
  """Examples (by index) of each row: best fit decreasing. The longest
  example goes first (ties in the examples' order), each into the open row
  with the least room that holds it (ties: the row opened last), else a
  new row; a row closes when full or holding `per_row`."""
  rows: list[list[int]] = []
  # open[f]: rows with f positions free, a stack; bit f of `has` is set
  # while open[f] is not empty.
  open_rows: list[list[int]] = [[] for _ in range(t + 1)]
  has = 0
  for i in np.argsort(-lengths, kind="stable").tolist():
    n = int(lengths[i])
    room = has >> n  # bit k: a row with n + k free
    if room:
      f = n + (room & -room).bit_length() - 1
      r = open_rows[f].pop()
      if not open_rows[f]:
        has &= ~(1 << f)
      rows[r].append(i)
      free = f - n
    else:
      r = len(rows)
      rows.append([i])
      free = t - n
    if free and len(rows[r]) < per_row:
      open_rows[free].append(r)
      has |= 1 << free
  return rows


def pack(features: dict[str, np.ndarray], per_row: int,
         token_keys: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
  """N right-padded examples → R rows of up to `per_row` examples.

  Args:
    features: TOKEN_KEYS [N, T] ("attention_mask" 1 on an example's
      tokens, 0 on padding), `token_keys` [N, T, ...] and per-example
      features [N, ...].
    per_row: K, at most this many examples in a row.
    token_keys: per-token features besides TOKEN_KEYS (a tagger's labels;
      names `features` lacks, e.g. a task's per-token predictions, are
      skipped).

  Returns:
    TOKEN_KEYS and `token_keys` [R, T, ...] ("attention_mask" the slot's
    segment id 1..K, 0 on padding; the others' padding keeps the value
    the examples' padding has, e.g. the pad id, or -1 for "no label"),
    CLS / SLOT_WEIGHTS / SLOT_INDEX [R, K], and every per-example feature
    [R, K, ...] (zeros in empty slots).
  """
  mask = np.asarray(features["attention_mask"])
  n, t = mask.shape
  lengths = mask.astype(bool).sum(axis=1)
  rows = _assign(lengths, t, per_row)
  r = len(rows)
  tokens = TOKEN_KEYS + tuple(k for k in token_keys if k in features)
  out = {}
  for k in tokens:
    v = np.asarray(features[k])
    # Padding keeps the examples' own padding value (the tokenizer's pad
    # id, a label that carries no loss); segment 0 hides it from attention.
    padding = v[mask == 0]
    out[k] = np.full((r, t) + v.shape[2:], padding[0] if padding.size else 0,
                     v.dtype)
  out["attention_mask"][:] = 0
  out[CLS] = np.zeros((r, per_row), np.int32)
  out[SLOT_WEIGHTS] = np.zeros((r, per_row), np.float32)
  out[SLOT_INDEX] = np.full((r, per_row), -1, np.int32)
  per_example = [k for k in features if k not in tokens]
  for k in per_example:
    out[k] = np.zeros((r, per_row) + features[k].shape[1:], features[k].dtype)
  for row, members in enumerate(rows):
    at = 0
    for slot, i in enumerate(members):
      m = int(lengths[i])
      for k in tokens:
        out[k][row, at:at + m] = features[k][i, :m]
      out["attention_mask"][row, at:at + m] = slot + 1
      out[CLS][row, slot] = at
      out[SLOT_WEIGHTS][row, slot] = 1.0
      out[SLOT_INDEX][row, slot] = i
      for k in per_example:
        out[k][row, slot] = features[k][i]
      at += m
  return out


def unpack(predictions: dict[str, np.ndarray], packed: dict[str, np.ndarray],
           num_examples: int, token_keys: tuple[str, ...] = ()
           ) -> dict[str, np.ndarray]:
  """Predictions of `pack`'s rows → [N, ...] in example order.

  Args:
    predictions: [R, K, ...] per slot, or for `token_keys` [R, T, ...] per
      token.
    packed: the rows (`pack`'s output: SLOT_INDEX, CLS, "attention_mask").
    num_examples: N.
    token_keys: the per-token predictions.

  Returns:
    [N, ...] per example; per token [N, T, ...], an example's tokens at
    its own positions 0..m-1 and zeros after them, as if it had a row
    alone.
  """
  slot_index = np.asarray(packed[SLOT_INDEX])
  flat = slot_index.reshape(-1)
  filled = flat >= 0
  order = flat[filled]
  if np.any(np.sort(order) != np.arange(num_examples)):
    raise ValueError(f"The packed rows hold {order.size} examples, not each "
                     f"of the {num_examples} once.")
  # Each real token: its row, position, example, and position in the example.
  segments = np.asarray(packed["attention_mask"])
  rows, positions = np.nonzero(segments)
  slots = segments[rows, positions] - 1
  examples = slot_index[rows, slots]
  within = positions - np.asarray(packed[CLS])[rows, slots]
  out = {}
  for k, v in predictions.items():
    v = np.asarray(v)
    if k in token_keys:
      result = np.zeros((num_examples,) + v.shape[1:], v.dtype)
      result[examples, within] = v[rows, positions]
    else:
      values = v.reshape((-1,) + v.shape[2:])[filled]
      result = np.empty_like(values)
      result[order] = values
    out[k] = result
  return out


def token_slots(batch: dict) -> jax.Array:
  """Which example each token belongs to, one-hot: [N, T, K] for a packed
  batch (segment k + 1 is slot k), [N, T, 1] for one example a row; 0 on
  padding. A per-token loss sums each example's tokens through it."""
  mask = batch["attention_mask"]
  if SLOT_WEIGHTS not in batch:
    return (mask > 0)[..., None].astype(jnp.float32)
  return jax.nn.one_hot(mask - 1, batch[SLOT_WEIGHTS].shape[-1],
                        dtype=jnp.float32)


def example_weights(batch: dict) -> jax.Array:
  """Each example's weight: the loop's row "weights" [N] (0 for rows that
  pad a batch), times SLOT_WEIGHTS [N, K] in a packed batch."""
  weights = batch["weights"].astype(jnp.float32)
  if SLOT_WEIGHTS in batch:
    weights = weights[:, None] * batch[SLOT_WEIGHTS].astype(jnp.float32)
  return weights


def padding_fraction(features: dict[str, np.ndarray]) -> float:
  """The share of positions that are padding."""
  mask = np.asarray(features["attention_mask"])
  return float(1.0 - np.count_nonzero(mask) / mask.size) if mask.size else 0.0
