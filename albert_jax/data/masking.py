"""Masked-LM targets: ALBERT's n-gram whole-word masking, vectorised.

The official `create_masked_lm_predictions` walks shuffled word starts one at
a time, drawing an n-gram length n ∝ 1/n (n ≤ `max_ngram`), shrinking n when
the span would exceed the budget `min(max_predictions, max(1,
round(len·0.15)))`, skipping spans that overlap earlier ones, and finally
replacing each chosen token by [MASK] (80%), itself (10%) or a random id (10%).

Here the same procedure runs on a whole batch at once: round r tries the r-th
shuffled start word of every row simultaneously, so Python loops over rounds
(≈ budget / mean span length, a few dozen), never over tokens. Randomness
comes from a counter-based hash of (key, round, position): a row's masks
depend only on its own key, not on the batch it lands in, which is what makes
static masking and exact resume possible.

For speed (see experiments/benchmarks/data_throughput.py), words are numbered
across the whole batch so that lookups are 1-D gathers, everything a round
needs that does not depend on earlier rounds is computed for a block of
rounds at once, only as many places of the shuffled order as the rounds reach
are sorted, and random draws are made only where they are used. The streams
are `row_random`'s: stream 1 orders the start words, 2 draws the n-gram
lengths, 3 decides [MASK] / random / unchanged per chosen token and 4 draws
its random id.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import numpy as np

from albert_jax.data.row_random import GOLDEN
from albert_jax.data.row_random import bits53
from albert_jax.data.row_random import mix_inplace
from albert_jax.data.row_random import row_base
from albert_jax.data.row_random import to_unit


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """Masking hyperparameters (defaults: the official ALBERT recipe)."""
  max_predictions: int = 20
  masked_lm_prob: float = 0.15
  max_ngram: int = 3
  favor_shorter_ngram: bool = True
  whole_word: bool = True
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1

  def __post_init__(self):
    if self.max_predictions < 1:
      raise ValueError("max_predictions must be >= 1.")
    if not 0.0 < self.masked_lm_prob < 1.0:
      raise ValueError("masked_lm_prob must be in (0, 1).")
    if self.max_ngram < 1:
      raise ValueError("max_ngram must be >= 1.")
    if self.mask_token_prob + self.random_token_prob > 1.0:
      raise ValueError("mask_token_prob + random_token_prob must be <= 1.")

  @property
  def ngram_probs(self) -> np.ndarray:
    """p(n) for n = 1..max_ngram: ∝ 1/n, or ∝ n reversed when not favouring
    shorter n-grams (the official flag's meaning)."""
    p = 1.0 / np.arange(1, self.max_ngram + 1)
    p = p / p.sum()
    return p if self.favor_shorter_ngram else p[::-1].copy()


def packed_predictions(config: MaskingConfig, seq_len: int,
                       max_per_row: int) -> int:
  """Prediction slots of a packed row of `max_per_row` (K) instances in
  `seq_len` tokens: each instance keeps its own budget min(max_predictions,
  max(1, round(n·masked_lm_prob))) <= n·masked_lm_prob + 1, so a row never
  needs more than min(K·max_predictions, floor(seq_len·masked_lm_prob) + K).
  """
  return min(max_per_row * config.max_predictions,
             int(seq_len * config.masked_lm_prob + 1e-9) + max_per_row)


def mask_batch(input_ids: np.ndarray,
               attention_mask: np.ndarray,
               keys: np.ndarray,
               *,
               word_start: np.ndarray,
               special: np.ndarray,
               mask_id: int,
               vocab_size: int,
               config: MaskingConfig = MaskingConfig()
               ) -> dict[str, np.ndarray]:
  """Chooses and applies MLM targets for a batch.

  The phases: number the words (`_words`), give each row its budget
  (`_budgets`), choose n-gram spans of words round by round (`_choose_spans`),
  list the tokens of the chosen words (`_chosen_tokens`), replace them 80/10/10
  (`_replace_tokens`) and pack the targets (`_pack_targets`).

  Args:
    input_ids: [B, T] int token ids ([CLS] A [SEP] B [SEP] pad...).
    attention_mask: [B, T], nonzero for real tokens.
    keys: [B] uint64 per-row random keys (`row_random.row_keys`).
    word_start: [V] bool, whether a vocabulary piece starts a word (the
      SentencePiece rule); ignored when `config.whole_word` is False.
    special: [V] bool, pieces never masked ([CLS], [SEP], padding...).
    mask_id: the [MASK] id.
    vocab_size: random replacements are drawn from [0, vocab_size), the full
      vocabulary as the official code does.
    config: masking hyperparameters.

  Returns:
    dict with "input_ids" [B, T] (masked copy), "masked_positions",
    "masked_ids" [B, P] int32 and "masked_weights" [B, P] float32 (1 for a
    real prediction), P = max_predictions; positions sorted ascending.
  """
  ids = np.asarray(input_ids)
  batch, length = ids.shape
  valid = np.asarray(attention_mask) != 0
  # Word and token counts fit int32 (smaller arrays, same values).
  itype = np.int32 if ids.size + batch < 2**31 else np.int64
  words = _words(ids, valid, word_start, special, config.whole_word, itype)
  budget = _budgets(valid, words.num_words, config, itype)
  covered = _choose_spans(keys, words, budget, config, itype)
  chosen_flat, chosen_row, chosen_pos = _chosen_tokens(covered, words, length)
  masked_ids_full, original = _replace_tokens(
      ids, keys, chosen_flat, chosen_row, chosen_pos, mask_id=mask_id,
      vocab_size=vocab_size, config=config)
  pos, labels, weights = _pack_targets(
      chosen_row, chosen_pos, original, batch, config.max_predictions)
  return {
      "input_ids": masked_ids_full,
      "masked_positions": pos,
      "masked_ids": labels,
      "masked_weights": weights,
  }


class _Words(NamedTuple):
  """A batch's words, numbered globally in row-major order (see `_words`).

  W = total_words. Row b's word w is global word first_word[b] + w, and
  first_word[b] + num_words[b] is the next row's first word (or W).
  """
  start_tok: np.ndarray  # [W] flat index (b·T + t) of each word's 1st token.
  num_words: np.ndarray  # [B] words per row.
  first_word: np.ndarray  # [B] global index of each row's first word.
  # [W + 2] maskable tokens (batch-wide) before global word g; the last two
  # entries: all of them. A span's token count is a difference of two.
  before: np.ndarray
  total_words: int  # W.
  max_words: int  # max(num_words), at least 1.


def _word_starts(ids: np.ndarray, valid: np.ndarray, word_start: np.ndarray,
                 special: np.ndarray, whole_word: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(maskable, starts), both [B, T] bool: the tokens that may be masked,
  and those of them that start a word.

  `ids`, `valid`: [B, T]; `word_start`, `special`: [V] bool. A word is a
  start piece and the non-start pieces after it; with `whole_word` off every
  maskable token is its own word. So every word is a run of consecutive
  maskable tokens within one row.
  """
  # One gather of a per-piece code: 0 = word start, 1 = other maskable
  # piece, 2/3 = special. (np.take is faster than fancy indexing; in-place
  # ops keep the number of fresh [B, T] arrays down.)
  code = np.asarray(special, bool).astype(np.uint8) << 1
  if whole_word:
    code |= ~np.asarray(word_start, bool)
  code = np.take(code, ids)
  maskable = code < 2
  maskable &= valid
  starts = code == 0
  starts &= valid
  del code
  # A continuation piece right after a special token (e.g. a segment that
  # begins mid-word after truncation) starts a word of its own.
  after_unmaskable = ~maskable[:, :-1]
  after_unmaskable &= maskable[:, 1:]
  starts[:, 1:] |= after_unmaskable
  del after_unmaskable
  starts[:, :1] |= maskable[:, :1]
  return maskable, starts


def _words(ids: np.ndarray, valid: np.ndarray, word_start: np.ndarray,
           special: np.ndarray, whole_word: bool, itype) -> _Words:
  """Numbers the words of a [B, T] batch (`_Words`; counts of `itype`).

  Flat 1-D arrays over the whole batch keep every later gather cheap.
  """
  batch, length = ids.shape
  maskable, starts = _word_starts(ids, valid, word_start, special, whole_word)
  start_tok = np.flatnonzero(starts.reshape(-1))  # token of each global word
  del starts
  total_words = len(start_tok)
  num_words = np.diff(np.searchsorted(
      start_tok, np.arange(batch + 1) * length)).astype(itype)
  first_word = (np.cumsum(num_words) - num_words).astype(itype)
  max_words = max(int(num_words.max(initial=0)), 1)
  # Before a row's first word every token is unmaskable, so row b's entry at
  # first_word[b] + num_words[b] counts exactly its own tokens to its end.
  maskable_cum = np.cumsum(maskable.reshape(-1), dtype=itype)
  del maskable
  # (One spare entry keeps the lookups of inactive rows in `_plan_rounds`
  # in bounds.)
  before = np.empty(total_words + 2, itype)
  before[:-2] = maskable_cum[start_tok]
  before[:-2] -= 1
  before[-2:] = maskable_cum[-1] if maskable_cum.size else 0
  return _Words(start_tok, num_words, first_word, before, total_words,
                max_words)


def _budgets(valid: np.ndarray, num_words: np.ndarray,
             config: MaskingConfig, itype) -> np.ndarray:
  """[B] tokens each row may mask: min(max_predictions, max(1,
  round(len·masked_lm_prob))), 0 for a row without words. `valid`: [B, T]
  bool; `num_words`: [B]."""
  budget = np.minimum(config.max_predictions, np.maximum(
      1, np.round(valid.sum(axis=1) * config.masked_lm_prob))).astype(itype)
  budget[num_words == 0] = 0
  return budget


def _start_order(keys: np.ndarray, num_words: np.ndarray, max_words: int,
                 head: int, itype) -> Callable[[int], np.ndarray]:
  """The shuffled order of each row's start words, as a function of how many
  places are needed: `places` -> [B, places] word indices (within the row).

  Ascending random keys (stream 1, 53-bit uniforms; ties by word index, i.e.
  a stable argsort), absent words (w >= num_words[b]) last. Only as many
  places as are asked for are sorted. `head` must be the first number of
  places asked for (the packed form partitions the `head` smallest keys to
  the front up front, and later calls partition further in place).
  """
  shift = max(1, (max_words - 1).bit_length())
  if shift <= 10:  # 53 key bits + 1 "absent" bit + shift fit in 64 bits
    return _packed_start_order(keys, num_words, max_words, head, shift, itype)
  return _argsort_start_order(keys, num_words, max_words, itype)


def _packed_start_order(keys, num_words, max_words, head, shift, itype):
  """`_start_order` with keys and word indices packed into one uint64
  ([B, max_words]: key bits << shift | word), so a plain sort (or partition)
  does it. Made a few rows at a time, in cache; the `head` smallest keys of
  each row are partitioned to the front up front."""
  batch = len(num_words)
  word_idx = np.arange(max_words, dtype=itype)
  order_bits = np.empty((batch, max_words), np.uint64)
  order_base = row_base(keys, 1)[:, None]
  with np.errstate(over="ignore"):
    step = (np.arange(max_words, dtype=np.uint64) + np.uint64(1)) * GOLDEN
  word_bits = word_idx.astype(np.uint64)
  chunk = max(1, (1 << 15) // max_words)
  scratch = np.empty((min(chunk, batch), max_words), np.uint64)
  for c0 in range(0, batch, chunk):
    part = order_bits[c0:c0 + chunk]
    np.add(order_base[c0:c0 + chunk], step, out=part)  # as bits53
    mix_inplace(part, scratch[:len(part)])
    part >>= np.uint64(11)
    part[word_idx >= num_words[c0:c0 + chunk, None]] = np.uint64(1 << 53)
    part <<= np.uint64(shift)
    part |= word_bits
    if head < max_words:  # the `head` smallest keys first (in place)
      part.partition(head - 1, axis=1)
  del scratch
  low_bits = np.uint64((1 << shift) - 1)

  def sorted_order(places):
    """Columns 0..places-1 of the sorted order: [B, places]."""
    if places == max_words:
      packed = np.sort(order_bits, axis=1)
    else:
      if places != head:  # (`head` is done above)
        order_bits.partition(places - 1, axis=1)
      packed = np.sort(order_bits[:, :places], axis=1)
    packed &= low_bits
    return packed.astype(itype)
  return sorted_order


def _argsort_start_order(keys, num_words, max_words, itype):
  """`_start_order` for rows too long to pack: float keys ([B, max_words],
  2.0 for absent words) and a stable argsort."""
  word_idx = np.arange(max_words, dtype=itype)
  order_keys = to_unit(bits53(row_base(keys, 1)[:, None],
                                np.arange(max_words, dtype=np.uint64)))
  order_keys[word_idx[None, :] >= num_words[:, None]] = 2.0

  def sorted_order(places):
    return np.argsort(order_keys, axis=1, kind="stable")[:, :places].astype(
        itype)
  return sorted_order


def _plan_rounds(start: np.ndarray, r0: int, r1: int, words: _Words,
                 budget: np.ndarray, draw_base: np.ndarray, cdf: np.ndarray,
                 itype) -> tuple[np.ndarray, ...]:
  """Everything about rounds r0..r1-1 that does not depend on earlier rounds.

  Args:
    start: [R, B] the rounds' start words (within each row), R = r1 - r0.
    r0, r1: the rounds.
    words: the batch's words.
    budget: [B] (`_budgets`).
    draw_base: [B] row seeds of stream 2 (n-gram lengths).
    cdf: [max_ngram] cumulative p(n).
    itype: integer type of counts.

  Returns:
    budget_or_none: [R, B] the budget, -1 where the start is no word (then
      no span ever fits);
    span_tokens: [R, max_ngram, B] tokens of the span of n = 1..max_ngram
      words from the start (non-decreasing in n);
    added: [R, max_ngram, B] what span n adds over span n-1;
    span_words: [R, max_ngram, B] global index of the word span n adds
      (n-th of the span; past the span's end its last word again).
    (Round-major, and n before the batch so that a round's rows per n are
    contiguous.)
  """
  max_ngram = len(cdf)
  offsets = np.arange(max_ngram, dtype=itype)
  # n ~ p(n), stream 2 column r: 1 + number of cdf steps the draw passed.
  draws = to_unit(bits53(draw_base[None, :],
                           np.arange(r0, r1, dtype=np.uint64)[:, None]))
  n_max = np.ones(draws.shape, itype)
  for c in cdf:
    n_max += draws >= c
  # As the official code: n is drawn from all of 1..max_ngram even near
  # the last word (its `cand_index_set` always holds max_ngram slices,
  # shorter ones at the end, so p(n) is never renormalised); an n-gram
  # running past the last word is just the words that are left.
  left = words.num_words - start
  present = left > 0  # r < num_words: the start is a word of the row
  np.minimum(n_max, left, out=n_max)
  n_max -= 1
  np.maximum(n_max, 0, out=n_max)  # now max n - 1 (0 for absent starts)
  first = words.first_word + start
  np.minimum(first, words.total_words, out=first)  # (absent starts: in bounds)
  # The words of the n-word spans, n = 1..max_ngram, past n_max repeating
  # the last one (covering a word twice, or adding 0 tokens, is harmless)
  # and their token counts, non-decreasing in n.
  span_words = np.minimum(offsets[:, None], n_max[:, None])
  span_words += first[:, None]
  span_tokens = words.before.take(span_words + 1)
  span_tokens -= words.before.take(first)[:, None]
  # What span n adds over span n-1, so span n's tokens are a masked sum.
  added = span_tokens.copy()
  added[:, 1:] -= span_tokens[:, :-1]
  budget_or_none = np.where(present, budget, -1).astype(itype)
  return budget_or_none, span_tokens, added, span_words


def _choose_spans(keys: np.ndarray, words: _Words, budget: np.ndarray,
                  config: MaskingConfig, itype) -> np.ndarray:
  """The n-gram spans: [W + max_ngram] bool, covered[g] = global word g is
  masked (the max_ngram padding entries at the end are never set; they keep
  span lookups past the last word in bounds).

  Round r tries the r-th shuffled start word of every row at once
  (`_take_round`). Rounds run in blocks (`_plan_rounds`), the first of about
  the budget (rarely exceeded), each next one 4x longer, until no row has
  room left or the words run out.
  """
  max_words = words.max_words
  head = min(max_words, config.max_predictions + 8)
  sorted_order = _start_order(keys, words.num_words, max_words, head, itype)
  cdf = np.cumsum(config.ngram_probs)
  draw_base = row_base(keys, 2)
  covered = np.zeros(words.total_words + config.max_ngram, bool)
  count = np.zeros(len(budget), itype)  # [B] tokens masked so far
  r0, r1 = 0, head
  while r0 < max_words:
    start = np.ascontiguousarray(sorted_order(r1)[:, r0:].T)
    budget_or_none, span_tokens, added, span_words = _plan_rounds(
        start, r0, r1, words, budget, draw_base, cdf, itype)
    for j in range(r1 - r0):
      # Tokens still allowed; a row is active (r < num_words and count <
      # budget) iff room > 0, and every span has >= 1 token.
      room = budget_or_none[j] - count
      if room.max(initial=0) <= 0:
        r1 = max_words
        break
      count += _take_round(covered, room, span_tokens[j], added[j],
                           span_words[j], itype)
    r0, r1 = r1, min(max_words, 4 * r1)
  return covered


def _take_round(covered: np.ndarray, room: np.ndarray,
                span_tokens: np.ndarray, added: np.ndarray,
                span_words: np.ndarray, itype) -> np.ndarray:
  """One round: each row takes the longest span from its start word that
  fits its `room` ([B]), unless a word of it is already `covered` (then
  none); marks the words in `covered` (in place). `span_tokens`, `added`,
  `span_words`: [max_ngram, B], one round of `_plan_rounds`. Returns [B]
  the tokens taken."""
  # take[k, b]: the span of k + 1 words fits (so do the shorter ones):
  # n shrunk to the longest span that fits the budget.
  take = span_tokens <= room
  # Rejected if any word of the span is already covered.
  overlap = covered.take(span_words)
  overlap &= take
  np.greater(take, np.logical_or.reduce(overlap, axis=0), out=take)
  covered[span_words[take]] = True
  added_j = added * take
  return added_j.sum(axis=0, dtype=itype)


def _chosen_tokens(covered: np.ndarray, words: _Words, length: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Every token of every covered word, in row-major order (so ascending
  positions within a row): (flat index b·T + t, row b, position t), each
  [N], N = tokens chosen in the batch."""
  chosen_words = np.flatnonzero(covered[:words.total_words])
  before = words.before
  word_len = before[chosen_words + 1] - before[chosen_words]
  chosen_flat = np.arange(word_len.sum()) + np.repeat(
      words.start_tok[chosen_words] - (np.cumsum(word_len) - word_len),
      word_len)
  chosen_row = chosen_flat // max(length, 1)
  chosen_pos = chosen_flat - chosen_row * length
  return chosen_flat, chosen_row, chosen_pos


def _replace_tokens(ids: np.ndarray, keys: np.ndarray,
                    chosen_flat: np.ndarray, chosen_row: np.ndarray,
                    chosen_pos: np.ndarray, *, mask_id: int, vocab_size: int,
                    config: MaskingConfig
                    ) -> tuple[np.ndarray, np.ndarray]:
  """80% [MASK], 10% random id, 10% unchanged, decided per chosen token.

  From streams 3 and 4 at the token's position (drawn for chosen tokens
  only). `ids`: [B, T]; the chosen_*: [N] (`_chosen_tokens`). Returns the
  masked copy of `ids` [B, T] (same dtype) and the original ids [N].
  """
  pos_counter = chosen_pos.astype(np.uint64)
  u = to_unit(bits53(row_base(keys, 3)[chosen_row], pos_counter))
  random_ids = np.minimum((to_unit(bits53(
      row_base(keys, 4)[chosen_row], pos_counter)) * vocab_size
                          ).astype(np.int64), vocab_size - 1)
  original = ids.reshape(-1)[chosen_flat]
  replaced = np.where(u < config.mask_token_prob, mask_id, np.where(
      u < config.mask_token_prob + config.random_token_prob, random_ids,
      original))
  masked_ids_full = np.array(ids, dtype=ids.dtype, order="C", copy=True)
  masked_ids_full.reshape(-1)[chosen_flat] = replaced.astype(ids.dtype)
  return masked_ids_full, original


def _pack_targets(chosen_row: np.ndarray, chosen_pos: np.ndarray,
                  original: np.ndarray, batch: int, p: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Positions [B, p] int32, labels [B, p] int32 and weights [B, p] float32
  of the chosen tokens ([N] each, row-major), padded with zeros (weight 0).

  A row never has more than its budget <= p; the cut is only a safeguard.
  """
  rows = np.arange(batch)
  rank = np.arange(len(chosen_row)) - np.searchsorted(chosen_row, rows)[
      chosen_row]
  keep = np.flatnonzero(rank < p)
  dest = chosen_row[keep] * p + rank[keep]
  pos = np.zeros((batch, p), np.int32)
  labels = np.zeros((batch, p), np.int32)
  weights = np.zeros((batch, p), np.float32)
  pos.reshape(-1)[dest] = chosen_pos[keep]
  labels.reshape(-1)[dest] = original[keep]
  weights.reshape(-1)[dest] = 1.0
  return pos, labels, weights
