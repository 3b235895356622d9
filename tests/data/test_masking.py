"""`albert_jax.data.masking`: n-gram whole-word masking against a faithful
re-implementation of the official `create_masked_lm_predictions`.

The official code draws from Python's `random` and numpy's global RNG, the
batch version from a counter-based hash, so the two can only agree in
distribution: the statistical tests compare them over thousands of
realistic instances, and the property tests pin the exact invariants.
"""

import dataclasses
import random

import hypothesis
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import numpy as np
import pytest

from albert_jax.data import masking
from albert_jax.data.row_random import row_keys

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
NUM_SPECIAL = 5
VOCAB = 30000
# Ids [5, 15000) start a word ("▁the", digits, punctuation), [15000, 30000)
# continue one ("ing"): the SentencePiece start-piece rule as a table.
WORD_START = np.arange(VOCAB) < VOCAB // 2
SPECIAL = np.arange(VOCAB) < NUM_SPECIAL
SEQ = 128


# ---------------------------------------------------------------------------
# The reference: official `create_masked_lm_predictions`, on ids.
# ---------------------------------------------------------------------------


def reference_mask(tokens, rng, *, word_start, max_predictions=20,
                   masked_lm_prob=0.15, max_ngram=3, favor_shorter_ngram=True,
                   whole_word=True, vocab_size=VOCAB):
  """The official procedure, line for line (do_permutation off).

  Args:
    tokens: unpadded ids, [CLS] A [SEP] B [SEP].
    rng: `random.Random`; it stands in for both of the official RNGs
      (Python's for the shuffle and 80/10/10, numpy's global one for n).
    word_start: indexable bool per id (the spm start-piece test).
    max_predictions, masked_lm_prob, max_ngram, favor_shorter_ngram,
      whole_word, vocab_size: the official flags.

  Returns:
    (output ids, sorted masked positions, their original ids, accepted span
    lengths in words).
  """
  cand_indexes = []
  for i, token in enumerate(tokens):
    if token in (CLS, SEP):
      continue
    # As coded: a non-start piece joins the previous candidate, even across
    # a [SEP] (never exercised by the generated data, whose segments start
    # on a word).
    if whole_word and cand_indexes and not word_start[token]:
      cand_indexes[-1].append(i)
    else:
      cand_indexes.append([i])
  output = list(tokens)
  num_to_predict = min(max_predictions,
                       max(1, int(round(len(tokens) * masked_lm_prob))))
  ngrams = list(range(1, max_ngram + 1))
  pvals = [1.0 / n for n in ngrams]
  pvals = [p / sum(pvals) for p in pvals]
  if not favor_shorter_ngram:
    pvals = pvals[::-1]
  # One entry per start word holding its 1..max_ngram-grams; near the end
  # the slices are shorter but still present, so `len(cand_index_set)` is
  # always max_ngram and p(n) is never renormalised.
  ngram_indexes = [[cand_indexes[idx:idx + n] for n in ngrams]
                   for idx in range(len(cand_indexes))]
  rng.shuffle(ngram_indexes)
  masked = []
  covered = set()
  spans = []
  for cand_index_set in ngram_indexes:
    if len(masked) >= num_to_predict:
      break
    if not cand_index_set:
      continue
    k = len(cand_index_set)
    weights = [p / sum(pvals[:k]) for p in pvals[:k]]
    n = rng.choices(ngrams[:k], weights=weights)[0]
    index_set = sum(cand_index_set[n - 1], [])
    n -= 1
    while len(masked) + len(index_set) > num_to_predict:
      if n == 0:
        break
      index_set = sum(cand_index_set[n - 1], [])
      n -= 1
    if len(masked) + len(index_set) > num_to_predict:
      continue
    if any(index in covered for index in index_set):
      continue
    spans.append(len(cand_index_set[n]))
    for index in index_set:
      covered.add(index)
      if rng.random() < 0.8:
        replacement = MASK
      elif rng.random() < 0.5:
        replacement = tokens[index]
      else:
        replacement = rng.randint(0, vocab_size - 1)
      output[index] = replacement
      masked.append((index, tokens[index]))
  masked.sort()
  return (output, [i for i, _ in masked], [t for _, t in masked], spans)


# ---------------------------------------------------------------------------
# Fake instances of realistic shape, generated without Python loops.
# ---------------------------------------------------------------------------


def fake_batch(rng, batch, seq_len=SEQ, piece_probs=(0.55, 0.25, 0.12, 0.08)):
  """[CLS] A [SEP] B [SEP] pad.. rows with words of 1-4 pieces.

  80% of rows are full (as most instances are), the rest shorter (short
  targets, document ends). A and B start on a word, as sentences do.
  """
  length = np.where(rng.random(batch) < 0.8, seq_len,
                    rng.integers(16, seq_len, batch))
  content = length - 3
  word_len = rng.choice(np.arange(1, 5), size=(batch, seq_len), p=piece_probs)
  first_piece = np.cumsum(word_len, axis=1) - word_len
  is_start = np.zeros((batch, seq_len), bool)
  r, c = np.nonzero(first_piece < seq_len)
  is_start[r, first_piece[r, c]] = True
  stream = np.where(is_start,
                    rng.integers(NUM_SPECIAL, VOCAB // 2, (batch, seq_len)),
                    rng.integers(VOCAB // 2, VOCAB, (batch, seq_len)))
  j = np.arange(seq_len)[None, :]
  # A/B split at a random word start in [1, content - 1] (one always exists
  # since words are at most 4 pieces and content >= 13).
  eligible = is_start & (j >= 1) & (j < content[:, None])
  split = np.argmax(np.where(eligible, rng.random((batch, seq_len)), -1.0),
                    axis=1)[:, None]
  src = np.clip(np.where(j <= split, j - 1, j - 2), 0, seq_len - 1)
  ids = np.take_along_axis(stream, src, axis=1)
  ids = np.where(j == 0, CLS, ids)
  ids = np.where((j == split + 1) | (j == length[:, None] - 1), SEP, ids)
  attention = j < length[:, None]
  ids = np.where(attention, ids, PAD).astype(np.int32)
  return ids, attention.astype(np.int32)


def run_mask_batch(ids, attention, keys, **config):
  return masking.mask_batch(ids, attention, keys, word_start=WORD_START,
                            special=SPECIAL, mask_id=MASK, vocab_size=VOCAB,
                            config=masking.MaskingConfig(**config))


def budgets(attention, max_predictions=20, prob=0.15):
  n = attention.sum(axis=1)
  return np.array([min(max_predictions, max(1, int(round(x * prob))))
                   for x in n])


def word_index(ids, attention, whole_word=True):
  """Word of each token as the batch code defines words ([B, T], -1 for
  [CLS]/[SEP]/padding)."""
  maskable = (attention != 0) & ~SPECIAL[ids]
  starts = maskable & (WORD_START[ids] if whole_word else True)
  prev = np.concatenate([np.zeros_like(maskable[:, :1]), maskable[:, :-1]], 1)
  starts |= maskable & ~prev
  return np.where(maskable, np.cumsum(starts, axis=1) - 1, -1)


def run_length_histogram(word_of_token, chosen, max_len=6):
  """Fractions of maximal runs of consecutive masked words by length
  (1..max_len-1, then >= max_len). Adjacent accepted spans merge in any
  output, so this is the span statistic both implementations expose."""
  batch, length = chosen.shape
  width = length + 1
  masked_word = np.zeros((batch, width), bool)
  r, c = np.nonzero(chosen & (word_of_token >= 0))
  masked_word[r, word_of_token[r, c]] = True
  flat = np.concatenate([masked_word, np.zeros((batch, 1), bool)], 1).ravel()
  edges = np.diff(flat.astype(np.int8), prepend=0)
  run_lengths = np.nonzero(edges == -1)[0] - np.nonzero(edges == 1)[0]
  hist = np.bincount(np.minimum(run_lengths, max_len), minlength=max_len + 1)
  return hist[1:] / hist[1:].sum()


def replacement_split(orig, out, chosen):
  """Fractions of chosen tokens turned to [MASK], kept, and replaced."""
  o, m = orig[chosen], out[chosen]
  to_mask = m == MASK
  kept = (m == o) & ~to_mask
  return np.array([to_mask.mean(), kept.mean(), (~to_mask & ~kept).mean()])


def reference_batch(ids, attention, seed, **flags):
  """Runs the reference over rows; returns chosen [B, T] bool, output ids,
  counts [B] and all accepted spans."""
  rng = random.Random(seed)
  start_table = WORD_START.tolist()
  chosen = np.zeros(ids.shape, bool)
  out = ids.copy()
  counts = np.zeros(len(ids), np.int64)
  spans = []
  for row, (row_ids, n) in enumerate(zip(ids.tolist(), attention.sum(1))):
    output, positions, labels, row_spans = reference_mask(
        row_ids[:n], rng, word_start=start_table, **flags)
    assert labels == [row_ids[p] for p in positions]
    chosen[row, positions] = True
    out[row, :n] = output
    counts[row] = len(positions)
    spans.extend(row_spans)
  return chosen, out, counts, spans


# ---------------------------------------------------------------------------
# Statistics against the reference and the official targets.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def realistic():
  """10k rows at seq 128 masked by both implementations (~3 s)."""
  rng = np.random.default_rng(0)
  ids, attention = fake_batch(rng, 10_000)
  keys = row_keys(7, 0, np.arange(len(ids)))
  got = run_mask_batch(ids, attention, keys)
  chosen = np.zeros(ids.shape, bool)
  weighted = got["masked_weights"] > 0
  rows = np.nonzero(weighted)[0]
  chosen[rows, got["masked_positions"][weighted]] = True
  ref_chosen, ref_out, ref_counts, ref_spans = reference_batch(
      ids, attention, seed=1)
  return dict(ids=ids, attention=attention, got=got, chosen=chosen,
              counts=weighted.sum(1), ref_chosen=ref_chosen, ref_out=ref_out,
              ref_counts=ref_counts, ref_spans=ref_spans)


def test_budget_met_exactly_like_reference(realistic):
  budget = budgets(realistic["attention"])
  counts, ref_counts = realistic["counts"], realistic["ref_counts"]
  assert (counts <= budget).all() and (ref_counts <= budget).all()
  # With ~65 words per row the budget is nearly always reachable. Neither
  # procedure guarantees it (a start word whose n-gram overlaps an earlier
  # span is skipped for good), so rows where the official procedure reaches
  # it must reach it in the batch one too, to the token, up to that rare
  # chance.
  reached = ref_counts == budget
  assert reached.mean() > 0.99
  assert abs((counts == budget).mean() - reached.mean()) < 0.005
  assert (counts[reached] == budget[reached]).mean() > 0.999
  n = realistic["attention"].sum(1)
  assert abs((counts / n).mean() - (ref_counts / n).mean()) < 0.01
  # And the fraction itself is the official 15% (rounding aside).
  assert abs(counts.sum() / n.sum() - 0.15) < 0.01


def test_span_lengths_match_reference(realistic):
  words = word_index(realistic["ids"], realistic["attention"])
  got = run_length_histogram(words, realistic["chosen"])
  ref = run_length_histogram(words, realistic["ref_chosen"])
  np.testing.assert_allclose(got, ref, atol=0.01)
  # The reference's own accepted spans: 1/n-favouring, with long spans
  # suppressed by the budget shrink and overlap skips, so 1 > 2 > 3.
  ref_spans = np.bincount(realistic["ref_spans"], minlength=4)[1:]
  ref_spans = ref_spans / ref_spans.sum()
  assert ref_spans[0] > ref_spans[1] > ref_spans[2] > 0.1
  # And the batch version does draw n-grams: runs of 3+ words are common
  # (they would be ~1% with unigrams only, from chance adjacency).
  assert got[2:].sum() > 0.1


def test_replacement_split_is_80_10_10(realistic):
  got = replacement_split(realistic["ids"], realistic["got"]["input_ids"],
                          realistic["chosen"])
  ref = replacement_split(realistic["ids"], realistic["ref_out"],
                          realistic["ref_chosen"])
  np.testing.assert_allclose(got, ref, atol=0.01)
  np.testing.assert_allclose(got, [0.8, 0.1, 0.1], atol=0.01)

  # The draw is per token, not per span: two adjacent chosen pieces are
  # both [MASK] 0.8² of the time (a per-span draw would give 0.8).
  def both_masked(out, chosen):
    pair = chosen[:, 1:] & chosen[:, :-1]
    return ((out[:, 1:] == MASK) & (out[:, :-1] == MASK))[pair].mean()

  got_pairs = both_masked(realistic["got"]["input_ids"], realistic["chosen"])
  ref_pairs = both_masked(realistic["ref_out"], realistic["ref_chosen"])
  assert abs(got_pairs - ref_pairs) < 0.015
  assert abs(got_pairs - 0.64) < 0.015
  # Nothing outside the chosen positions changes.
  changed = realistic["got"]["input_ids"] != realistic["ids"]
  assert not (changed & ~realistic["chosen"]).any()


def test_single_token_masking_matches_reference():
  # whole_word off: every piece is a candidate on its own.
  rng = np.random.default_rng(3)
  ids, attention = fake_batch(rng, 3000)
  keys = row_keys(11, 0, np.arange(len(ids)))
  got = run_mask_batch(ids, attention, keys, whole_word=False)
  weighted = got["masked_weights"] > 0
  chosen = np.zeros(ids.shape, bool)
  chosen[np.nonzero(weighted)[0], got["masked_positions"][weighted]] = True
  ref_chosen, _, ref_counts, _ = reference_batch(ids, attention, seed=4,
                                                 whole_word=False)
  budget = budgets(attention)
  # Nearly every row reaches its budget (see the whole-word test for why
  # not every one must).
  assert (weighted.sum(1) == budget).mean() > 0.999
  assert (ref_counts == budget).mean() > 0.999
  tokens = word_index(ids, attention, whole_word=False)
  np.testing.assert_allclose(run_length_histogram(tokens, chosen),
                             run_length_histogram(tokens, ref_chosen),
                             atol=0.015)
  # Continuation pieces get masked without the piece before them.
  cont = chosen & ~WORD_START[ids]
  partial = cont[:, 1:] & ~chosen[:, :-1]
  assert partial.sum() > 100


def test_ngram_near_sequence_end_is_not_renormalised():
  """[CLS] w1 w2 [SEP], budget 4 (prob 0.9): only w2 ends up masked iff w2
  is tried first and then w1 draws n >= 2 (whose span overlaps w2 and is
  skipped). Officially n is drawn from all of 1..3 even at the last words
  (the slice is shorter, not absent), so that is 1/2 * 5/11; renormalising
  over the n-grams that fit would give 1/2 * 1/3."""
  rows = 20_000
  ids = np.tile(np.array([[CLS, 10, 11, SEP]], np.int32), (rows, 1))
  attention = np.ones_like(ids)
  got = run_mask_batch(ids, attention, row_keys(5, 0, np.arange(rows)),
                       masked_lm_prob=0.9)
  only_w2 = ((got["masked_weights"].sum(1) == 1)
             & (got["masked_positions"][:, 0] == 2)).mean()
  rng = random.Random(0)
  start_table = WORD_START.tolist()
  ref_only_w2 = np.mean([
      reference_mask([CLS, 10, 11, SEP], rng, word_start=start_table,
                     masked_lm_prob=0.9)[1] == [2] for _ in range(rows)])
  assert abs(ref_only_w2 - 5 / 22) < 0.015
  assert abs(only_w2 - 5 / 22) < 0.015


def test_ngram_probs():
  np.testing.assert_allclose(masking.MaskingConfig().ngram_probs,
                             [6 / 11, 3 / 11, 2 / 11])
  np.testing.assert_allclose(
      masking.MaskingConfig(favor_shorter_ngram=False).ngram_probs,
      [2 / 11, 3 / 11, 6 / 11])
  np.testing.assert_allclose(masking.MaskingConfig(max_ngram=1).ngram_probs,
                             [1.0])


def test_longer_ngrams_when_not_favoured():
  # Reversed p(n) must show up as longer masked runs than the default.
  rng = np.random.default_rng(8)
  ids, attention = fake_batch(rng, 2000, piece_probs=(1.0, 0, 0, 0))
  keys = row_keys(1, 0, np.arange(len(ids)))
  words = word_index(ids, attention)
  hists = []
  for favor in (True, False):
    got = run_mask_batch(ids, attention, keys, favor_shorter_ngram=favor)
    weighted = got["masked_weights"] > 0
    chosen = np.zeros(ids.shape, bool)
    chosen[np.nonzero(weighted)[0], got["masked_positions"][weighted]] = True
    hists.append(run_length_histogram(words, chosen))
  mean_run = [(h * np.arange(1, len(h) + 1)).sum() for h in hists]
  assert mean_run[1] > mean_run[0] + 0.3


# ---------------------------------------------------------------------------
# Exact invariants on random batches.
# ---------------------------------------------------------------------------

SMALL_VOCAB = 40


@st.composite
def random_batches(draw):
  """Random ids (specials anywhere), right padding, a random start table."""
  batch = draw(st.integers(1, 6))
  length = draw(st.integers(1, 48))
  ids = draw(hnp.arrays(np.int32, (batch, length),
                        elements=st.integers(0, SMALL_VOCAB - 1)))
  lengths = draw(hnp.arrays(np.int64, (batch,),
                            elements=st.integers(0, length)))
  word_start = draw(hnp.arrays(np.bool_, (SMALL_VOCAB,)))
  special = np.zeros(SMALL_VOCAB, bool)
  special[:NUM_SPECIAL] = True
  attention = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
  ids = np.where(attention != 0, ids, PAD).astype(np.int32)
  config = masking.MaskingConfig(
      max_predictions=draw(st.integers(1, 12)),
      masked_lm_prob=draw(st.sampled_from([0.15, 0.3, 0.6])),
      max_ngram=draw(st.integers(1, 4)),
      favor_shorter_ngram=draw(st.booleans()),
      whole_word=draw(st.booleans()))
  seed = draw(st.integers(0, 2**32 - 1))
  return ids, attention, word_start, special, config, seed


def mask_small(ids, attention, keys, word_start, special, config):
  return masking.mask_batch(ids, attention, keys, word_start=word_start,
                            special=special, mask_id=MASK,
                            vocab_size=SMALL_VOCAB, config=config)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(random_batches())
def test_invariants(case):
  ids, attention, word_start, special, config, seed = case
  batch, length = ids.shape
  keys = row_keys(seed, 0, np.arange(batch))
  out = mask_small(ids, attention, keys, word_start, special, config)
  p = config.max_predictions

  # Shapes and dtypes.
  assert out["input_ids"].shape == (batch, length)
  assert out["input_ids"].dtype == ids.dtype
  for name, dtype in (("masked_positions", np.int32), ("masked_ids", np.int32),
                      ("masked_weights", np.float32)):
    assert out[name].shape == (batch, p) and out[name].dtype == dtype, name

  weights = out["masked_weights"]
  assert set(np.unique(weights)) <= {0.0, 1.0}
  weighted = weights > 0
  # Real predictions come first, then zero padding.
  assert (np.diff(weighted.astype(np.int8), axis=1) <= 0).all()
  assert (out["masked_positions"][~weighted] == 0).all()
  assert (out["masked_ids"][~weighted] == 0).all()

  valid = attention != 0
  maskable = valid & ~special[ids]
  budget = np.minimum(p, np.maximum(1, np.round(valid.sum(1)
                                                * config.masked_lm_prob)))
  word = word_index_for(ids, maskable, word_start, config.whole_word)
  changed = out["input_ids"] != ids
  for b in range(batch):
    pos = out["masked_positions"][b][weighted[b]]
    # Sorted, unique, within the budget, and never [CLS]/[SEP]/pad/special.
    assert (np.diff(pos) > 0).all()
    assert len(pos) <= budget[b] <= p
    assert maskable[b, pos].all()
    # Labels are the original ids.
    np.testing.assert_array_equal(out["masked_ids"][b][weighted[b]],
                                  ids[b, pos])
    # Changed positions are a subset of the selected ones, so weights count
    # == |changed ∪ selected|.
    selected = np.zeros(length, bool)
    selected[pos] = True
    assert not (changed[b] & ~selected).any()
    # Replacements are [MASK] or a vocabulary id.
    assert (out["input_ids"][b] >= 0).all()
    assert (out["input_ids"][b] < SMALL_VOCAB).all()
    # Whole words: a word is selected entirely or not at all.
    for w in np.unique(word[b][word[b] >= 0]):
      in_word = selected[word[b] == w]
      assert in_word.all() or not in_word.any()
    # Single-piece words: the first start word tried always fits, so a row
    # with something maskable gets a prediction; with unigrams no span
    # can overlap, so the count is exactly the budget (or all there is).
    if (word[b][maskable[b]] == np.arange(maskable[b].sum())).all():
      assert len(pos) >= min(1, maskable[b].sum())
      if config.max_ngram == 1:
        assert len(pos) == min(budget[b], maskable[b].sum())

  # with whole_word off, every piece is its own candidate: the same as
  # whole-word masking with every piece a word start.
  if not config.whole_word:
    all_start = mask_small(ids, attention, keys, np.ones_like(word_start),
                           special, dataclasses.replace(config, whole_word=True))
    for name in out:
      np.testing.assert_array_equal(out[name], all_start[name])

  # Same keys → same output.
  again = mask_small(ids, attention, keys, word_start, special, config)
  for name in out:
    np.testing.assert_array_equal(out[name], again[name])

  # A row depends only on its own key: alone, moved within another batch,
  # and padded further, it gets the same mask.
  b = batch - 1
  other_ids = np.concatenate(
      [np.full((2, length + 5), UNK, np.int32),
       np.pad(ids[b:b + 1], ((0, 0), (0, 5)), constant_values=PAD)])
  other_attention = np.concatenate(
      [np.ones((2, length + 5), np.int32),
       np.pad(attention[b:b + 1], ((0, 0), (0, 5)))])
  other_keys = np.concatenate([row_keys(seed + 1, 0, [0, 1]),
                               keys[b:b + 1]])
  moved = mask_small(other_ids, other_attention, other_keys, word_start,
                     special, config)
  np.testing.assert_array_equal(moved["input_ids"][2, :length],
                                out["input_ids"][b])
  for name in ("masked_positions", "masked_ids", "masked_weights"):
    np.testing.assert_array_equal(moved[name][2], out[name][b])


def word_index_for(ids, maskable, word_start, whole_word):
  starts = maskable & (word_start[ids] if whole_word else True)
  prev = np.concatenate([np.zeros_like(maskable[:, :1]), maskable[:, :-1]], 1)
  starts |= maskable & ~prev
  return np.where(maskable, np.cumsum(starts, axis=1) - 1, -1)


def test_whole_words_in_realistic_rows():
  rng = np.random.default_rng(2)
  ids, attention = fake_batch(rng, 500)
  got = run_mask_batch(ids, attention, row_keys(0, 0, np.arange(500)))
  words = word_index(ids, attention)
  for b in range(len(ids)):
    pos = got["masked_positions"][b][got["masked_weights"][b] > 0]
    for w in np.unique(words[b, pos]):
      assert set(np.nonzero(words[b] == w)[0]) <= set(pos)


def test_continuation_after_separator_starts_a_word():
  """A non-start piece right after [SEP] (a segment truncated mid-word)
  starts a word of its own. (The official code would glue it to the last
  word before [SEP]; this package keeps words inside segments.)"""
  row = [CLS, 10, VOCAB - 1, SEP, VOCAB - 2, VOCAB - 3, 11, SEP]
  rows = 2000
  ids = np.tile(np.array([row], np.int32), (rows, 1))
  got = run_mask_batch(ids, np.ones_like(ids),
                       row_keys(0, 0, np.arange(rows)),
                       masked_lm_prob=0.3, max_ngram=1)
  chosen = np.zeros(ids.shape, bool)
  weighted = got["masked_weights"] > 0
  chosen[np.nonzero(weighted)[0], got["masked_positions"][weighted]] = True
  # Words [10 ·], [· ·], [11] and a budget of round(8 * 0.3) = 2: whichever
  # word is tried first is masked whole and leaves no room for a two-piece
  # word, so each is masked alone a third of the time. Glued to the word
  # before [SEP], the second would be 4 pieces and never fit.
  np.testing.assert_array_equal(chosen[:, 1], chosen[:, 2])
  np.testing.assert_array_equal(chosen[:, 4], chosen[:, 5])
  np.testing.assert_array_equal(
      chosen[:, 1].astype(int) + chosen[:, 4] + chosen[:, 6], 1)
  assert abs(chosen[:, 4].mean() - 1 / 3) < 0.04


def test_epochs_and_seeds_change_masks():
  rng = np.random.default_rng(4)
  ids, attention = fake_batch(rng, 64)
  index = np.arange(64)
  base = run_mask_batch(ids, attention, row_keys(0, 0, index))
  same = run_mask_batch(ids, attention, row_keys(0, 0, index))
  np.testing.assert_array_equal(base["masked_positions"],
                                same["masked_positions"])
  for keys in (row_keys(0, 1, index), row_keys(1, 0, index)):
    other = run_mask_batch(ids, attention, keys)
    differs = (other["masked_positions"] != base["masked_positions"]).any(1)
    # Two masks of 19 tokens among ~65 words essentially never coincide in a
    # full row; short rows (budget 2-3) may by chance.
    full = attention.sum(1) == SEQ
    assert full.sum() > 30 and differs[full].all()
    assert differs.mean() > 0.9


def test_row_keys():
  keys = row_keys(0, 0, np.arange(1000))
  assert keys.dtype == np.uint64 and keys.shape == (1000,)
  assert len(np.unique(keys)) == 1000
  # Keys of other epochs and seeds are fresh, and an epoch per row works
  # (the loader's dynamic masking passes one).
  assert not set(keys) & set(row_keys(0, 1, np.arange(1000)))
  assert not set(keys) & set(row_keys(1, 0, np.arange(1000)))
  per_row = row_keys(0, np.array([0, 1]), np.array([5, 5]))
  assert per_row[0] == keys[5]
  assert per_row[1] == row_keys(0, 1, [5])[0]


def test_rows_without_maskable_tokens():
  ids = np.array([[CLS, SEP, SEP, PAD], [PAD] * 4], np.int32)
  attention = np.array([[1, 1, 1, 0], [0] * 4], np.int32)
  got = run_mask_batch(ids, attention, row_keys(0, 0, [0, 1]))
  assert not got["masked_weights"].any()
  np.testing.assert_array_equal(got["input_ids"], ids)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_predictions=0), "max_predictions"),
    (dict(masked_lm_prob=0.0), "masked_lm_prob"),
    (dict(masked_lm_prob=1.0), "masked_lm_prob"),
    (dict(max_ngram=0), "max_ngram"),
    (dict(mask_token_prob=0.95, random_token_prob=0.1), "<= 1"),
])
def test_config_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    masking.MaskingConfig(**kwargs)
