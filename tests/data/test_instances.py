"""`albert_jax.data.instances`: documents → [CLS] A [SEP] B [SEP] instances.

The generator draws from a numpy Generator per document where the official
code draws from one `random.Random`, so nothing here is compared draw for
draw: the tests check the layout, the official behaviours, and their rates.
Documents are built from counting integer runs (document d holds
BASE + d·STRIDE + 0, 1, 2, ...), so a token says which document it came
from and the order of two segments is a comparison.
"""

import collections

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from albert_jax.data import instances as inst_lib

CLS, SEP = 2, 3
BASE, STRIDE = 1000, 10_000


def make_corpus(rng, num_docs, num_sentences, sentence_len):
  """Documents of counting runs; both ranges are inclusive (lo, hi)."""
  docs = []
  for d in range(num_docs):
    n = int(rng.integers(num_sentences[0], num_sentences[1] + 1))
    lens = rng.integers(sentence_len[0], sentence_len[1] + 1, n)
    ends = np.cumsum(lens)
    assert ends[-1] < STRIDE
    base = BASE + d * STRIDE
    docs.append([list(range(base + e - l, base + e))
                 for e, l in zip(ends.tolist(), lens.tolist())])
  return docs


def doc_of(tokens):
  return (np.asarray(tokens) - BASE) // STRIDE


def segments(instance):
  """(A, B) of a sentence-pair instance, checking the layout on the way."""
  tokens, types = instance.tokens, instance.token_type_ids
  assert tokens.dtype == np.int32 and types.dtype == np.int8
  assert tokens.shape == types.shape
  assert tokens[0] == CLS and tokens[-1] == SEP
  seps = np.nonzero(tokens == SEP)[0]
  assert len(seps) == 2, tokens
  a, b = tokens[1:seps[0]], tokens[seps[0] + 1:-1]
  assert len(a) >= 1 and len(b) >= 1
  # [CLS] A [SEP] are type 0, B [SEP] type 1.
  np.testing.assert_array_equal(
      types, [0] * (len(a) + 2) + [1] * (len(b) + 1))
  return a, b


def contiguous(run):
  return bool((np.diff(run) == 1).all())


def create(docs, seed=0, **config):
  return inst_lib.create_instances(docs, inst_lib.InstanceConfig(**config),
                                   seed, CLS, SEP)


@pytest.fixture(scope="module")
def corpus():
  # ~2.5k instances: 300 documents of 2-14 sentences, 1-24 tokens each.
  return make_corpus(np.random.default_rng(0), 300, (2, 14), (1, 24))


# ---------------------------------------------------------------------------
# SOP (ALBERT, the default).
# ---------------------------------------------------------------------------


def test_sop_layout_order_and_label_rate(corpus):
  made, stats = create(corpus, max_seq_length=48, dupe_factor=3)
  assert len(made) > 1500
  labels = []
  for x in made:
    assert len(x.tokens) <= 48
    a, b = segments(x)
    # One document per instance: SOP never draws from another document.
    assert len(set(doc_of(np.concatenate([a, b])))) == 1
    # Each segment is a run of consecutive text (truncation trims ends).
    assert contiguous(a) and contiguous(b)
    if x.label == 0:
      assert a.max() < b.min()
    else:
      assert x.label == 1 and b.max() < a.min()
    # Untruncated pairs are adjacent text: B follows A, or A follows B.
    if len(a) + len(b) < 48 - 3:
      first, second = (a, b) if x.label == 0 else (b, a)
      assert second[0] == first[-1] + 1
    labels.append(x.label)
  # Swap with probability 0.5 (~2.5k instances: 3 sd ≈ 0.03).
  assert abs(np.mean(labels) - 0.5) < 0.035
  assert stats.instances == len(made)
  assert stats.tokens == sum(len(x.tokens) for x in made)
  assert stats.documents == len(corpus)
  assert stats.sentences == sum(len(d) for d in corpus)
  assert stats.skipped_documents == 0


def test_sop_skips_one_sentence_documents():
  rng = np.random.default_rng(1)
  docs = make_corpus(rng, 60, (1, 6), (1, 10))
  lone = {d for d, doc in enumerate(docs) if len(doc) == 1}
  assert lone
  made, stats = create(docs, max_seq_length=32, dupe_factor=2)
  # Counted once, not once per duplicate.
  assert stats.skipped_documents == len(lone)
  used = {int(d) for x in made for d in doc_of(x.tokens[x.tokens > SEP])}
  assert not used & lone
  # No instance has a random-document B: chunks are extended to two
  # sentences instead of falling back to an NSP negative.
  for x in made:
    a, b = segments(x)
    assert len(set(doc_of(np.concatenate([a, b])))) == 1


def test_sop_with_official_nsp_negatives():
  """`nsp_negatives_in_sop`: a chunk holding one segment takes B from
  another document with label 1 (albert #234), one-sentence documents
  included."""
  rng = np.random.default_rng(2)
  # Every sentence (40 tokens) exceeds the target (at most 29), so every
  # chunk is a single segment.
  docs = make_corpus(rng, 50, (1, 4), (40, 40))
  made, stats = create(docs, max_seq_length=32, nsp_negatives_in_sop=True)
  assert stats.skipped_documents == 0
  # One instance per sentence: the unused remainder is put back.
  assert len(made) == sum(len(d) for d in docs)
  for x in made:
    a, b = segments(x)
    assert x.label == 1
    assert len(set(doc_of(a))) == 1 and len(set(doc_of(b))) == 1
    assert doc_of(a)[0] != doc_of(b)[0]
  # With multi-sentence chunks the usual swaps come back alongside.
  docs = make_corpus(rng, 200, (1, 8), (1, 12))
  made, _ = create(docs, max_seq_length=48, nsp_negatives_in_sop=True)
  kinds = collections.Counter()
  for x in made:
    a, b = segments(x)
    same = doc_of(a)[0] == doc_of(b)[0]
    if not same:
      kinds["random"] += 1
      assert x.label == 1
    elif x.label == 1:
      kinds["swapped"] += 1
      assert b.max() < a.min()
    else:
      kinds["ordered"] += 1
      assert a.max() < b.min()
  assert min(kinds.values()) > 20, kinds


# ---------------------------------------------------------------------------
# NSP (BERT).
# ---------------------------------------------------------------------------


def test_nsp_label_means_random_document(corpus):
  made, _ = create(corpus, max_seq_length=48, objective="nsp", dupe_factor=3)
  assert len(made) > 1500
  for x in made:
    a, b = segments(x)
    assert len(x.tokens) <= 48
    assert len(set(doc_of(a))) == 1 and len(set(doc_of(b))) == 1
    assert contiguous(a) and contiguous(b)
    random_next = doc_of(a)[0] != doc_of(b)[0]
    assert random_next == (x.label == 1)
    if not random_next:
      assert a.max() < b.min()  # never swapped in NSP


def test_nsp_label_rate(long_documents):
  docs = long_documents[:1000]
  # short_seq_prob=0: a short target of 2-3 tokens would make every 1-3
  # token sentence a chunk of its own, each a forced random-next.
  made, _ = create(docs, max_seq_length=64, objective="nsp",
                   short_seq_prob=0)
  last_token = {d: doc[-1][-1] for d, doc in enumerate(docs)}
  coin = []
  for x in made:
    a, _ = segments(x)
    # A chunk of one sentence (a document's last) always takes a random B.
    # A multi-sentence chunk never puts its last sentence in A, and these A
    # (1-3 tokens) are never trimmed, so ending on the document's last
    # token singles those out.
    if a[-1] == last_token[int(doc_of(a)[0])]:
      assert x.label == 1
    else:
      coin.append(x.label)
  assert len(coin) > 3500
  assert abs(np.mean(coin) - 0.5) < 0.025


# ---------------------------------------------------------------------------
# Target lengths.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_documents():
  # 2000 documents of ~160 tokens in 1-3 token sentences: a chunk ends
  # within 2 tokens of its target, and a document holds several.
  return make_corpus(np.random.default_rng(3), 2000, (80, 80), (1, 3))


def first_lengths(made):
  """A+B length of each document's first instance (per duplicate), or -1
  where its B came from another document (which may run out of text)."""
  out, previous = [], None
  for x in made:
    d = doc_of(x.tokens[1])  # A's first token
    if d != previous:
      out.append(len(x.tokens) - 3 if doc_of(x.tokens[-2]) == d else -1)
    previous = d
  return np.array(out)


@pytest.mark.parametrize("objective", ["sop", "nsp"])
def test_short_seq_prob(long_documents, objective):
  max_tokens = 64 - 3
  made, _ = create(long_documents, max_seq_length=64, short_seq_prob=0.3,
                   dupe_factor=2, objective=objective)
  first = first_lengths(made)
  assert len(first) == 2 * len(long_documents)
  # The target is drawn before the NSP coin, so dropping random-next
  # instances leaves an unbiased sample.
  first = first[first >= 0]
  assert len(first) > 1500
  # A full target gives exactly max_tokens (the chunk overshoots and is
  # truncated); a short one, randint(2, 61), ends within 2 tokens of it, so
  # length <= 58 happens for 55-57 of its 60 values: 0.3·(55..57)/60.
  short = first <= max_tokens - 3
  assert abs(short.mean() - 0.3 * 56 / 60) < 0.025
  assert ((first == max_tokens) | short
          | (first >= max_tokens - 2)).all()
  # Short targets are spread uniformly over [2, 58].
  assert 26 < first[short].mean() < 36
  assert first[short].min() <= 8
  # Never with short_seq_prob 0; (nearly) always with 1.
  made, _ = create(long_documents[:300], max_seq_length=64, short_seq_prob=0,
                   objective=objective)
  first = first_lengths(made)
  assert (first[first >= 0] == max_tokens).all()
  made, _ = create(long_documents[:300], max_seq_length=64, short_seq_prob=1,
                   objective=objective)
  first = first_lengths(made)
  assert (first[first >= 0] < max_tokens).mean() > 0.9


# ---------------------------------------------------------------------------
# "none" (RoBERTa FULL-SENTENCES).
# ---------------------------------------------------------------------------


def test_full_sentences_packing():
  rng = np.random.default_rng(4)
  docs = make_corpus(rng, 80, (1, 8), (1, 12))
  # A sentence longer than a whole instance gets split.
  docs[5][1] = list(range(docs[5][1][0], docs[5][1][0] + 75))
  docs[5][2:] = [[t + 80 for t in s] for s in docs[5][2:]]
  max_seq = 32
  budget = max_seq - 2
  sentence_len = {t: len(s) for doc in docs for s in doc for t in s}
  made, stats = create(docs, max_seq_length=max_seq, objective="none",
                       dupe_factor=2)
  assert stats.instances == len(made)
  stream = []
  crossing = 0
  unpacked = 0
  for i, x in enumerate(made):
    assert x.label == -1 and not x.token_type_ids.any()
    assert len(x.tokens) <= max_seq
    assert x.tokens[0] == CLS and x.tokens[-1] == SEP
    content = x.tokens[1:-1]
    assert len(content) and content[0] != SEP and content[-1] != SEP
    # Inside an instance, a [SEP] marks a document boundary and every
    # document boundary has one.
    for left, right in zip(content[:-1], content[1:]):
      if left == SEP:
        assert right != SEP
      elif right != SEP:
        assert doc_of(left) == doc_of(right)
    seps = np.nonzero(content == SEP)[0]
    for s in seps:
      assert doc_of(content[s - 1]) != doc_of(content[s + 1])
    crossing += len(seps) > 0
    # Packed: an instance is closed only when the next sentence (with its
    # boundary [SEP], if any) would not fit, or the duplicate ends.
    if i + 1 < len(made):
      nxt = made[i + 1].tokens[1]
      boundary = int(doc_of(nxt) != doc_of(content[-1]))
      unpacked += (len(content) + boundary + sentence_len[int(nxt)] <= budget
                   and len(content) < budget)
    stream.extend(content[content != SEP].tolist())
  assert crossing > 10
  assert unpacked <= 1  # the end of the first duplicate
  # Every token appears once per duplicate, each document whole and in
  # order, and the two duplicates visit documents in different orders.
  counts = collections.Counter(stream)
  assert set(counts.values()) == {2}
  assert set(counts) == {t for doc in docs for s in doc for t in s}
  order = []
  for start in range(len(stream)):
    if start == 0 or doc_of(stream[start]) != doc_of(stream[start - 1]):
      order.append((int(doc_of(stream[start])), start))
  blocks = []
  for (d, start), (_, end) in zip(order, order[1:] + [(None, len(stream))]):
    flat = [t for s in docs[d] for t in s]
    copies = (end - start) // len(flat)
    assert stream[start:end] == flat * copies
    blocks.extend([d] * copies)
  assert sorted(blocks[:len(docs)]) == list(range(len(docs)))
  assert blocks[:len(docs)] != blocks[len(docs):]
  assert blocks[:len(docs)] != list(range(len(docs)))


def test_full_sentences_no_doubled_separators():
  # Regression: the boundary [SEP] used to be appended eagerly, ending an
  # instance with "[SEP] [SEP]" when the next document did not fit, and
  # doubling around empty documents.
  cfg = inst_lib.InstanceConfig(max_seq_length=12, objective="none")
  docs = [[[10, 11, 12, 13, 14, 15, 16, 17, 18]], [[20, 21, 22]], [],
          [[30]]]
  made = list(inst_lib.pack_full_sentences(docs, cfg, CLS, SEP,
                                           inst_lib.Stats()))
  assert [x.tokens.tolist() for x in made] == [
      [CLS, 10, 11, 12, 13, 14, 15, 16, 17, 18, SEP],
      [CLS, 20, 21, 22, SEP, 30, SEP]]



def test_exact_length_cuts_the_stream_at_exactly_max_seq_length():
  """GPT-1's windows: a sentence that does not fit fills the row and goes
  on in the next; only the last row is short."""
  cfg = inst_lib.InstanceConfig(max_seq_length=6, objective="none",
                                exact_length=True)
  docs = [[[10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21]],
          [[30, 31]], [], [[40]]]
  made = list(inst_lib.pack_full_sentences(docs, cfg, CLS, SEP,
                                           inst_lib.Stats()))
  assert [x.tokens.tolist() for x in made] == [
      [CLS, 10, 11, 12, 13, SEP],
      [CLS, 14, 15, 16, 17, SEP],
      [CLS, 18, 19, 20, 21, SEP],
      [CLS, 30, 31, SEP, 40, SEP]]
  # Without it, the same documents end rows at sentence ends.
  loose = inst_lib.InstanceConfig(max_seq_length=6, objective="none")
  made = list(inst_lib.pack_full_sentences(docs, loose, CLS, SEP,
                                           inst_lib.Stats()))
  assert [x.tokens.tolist() for x in made] == [
      [CLS, 10, 11, 12, SEP],
      [CLS, 13, 14, 15, 16, SEP],
      [CLS, 17, 18, 19, 20, SEP],
      [CLS, 21, SEP, 30, 31, SEP],
      [CLS, 40, SEP]]


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(
    st.lists(st.lists(st.integers(1, 30), max_size=5), min_size=1,
             max_size=6),
    st.integers(5, 40))
def test_exact_length_rows_are_full_and_keep_the_stream(lengths, seq_len):
  docs, doc_of_token, next_id = [], {}, 10
  for d, sentence_lengths in enumerate(lengths):
    doc = []
    for n in sentence_lengths:
      doc.append(list(range(next_id, next_id + n)))
      doc_of_token.update({t: d for t in doc[-1]})
      next_id += n
    docs.append(doc)
  cfg = inst_lib.InstanceConfig(max_seq_length=seq_len, objective="none",
                                exact_length=True)
  made = [x.tokens.tolist() for x in inst_lib.pack_full_sentences(
      docs, cfg, CLS, SEP, inst_lib.Stats())]
  for row in made:
    assert row[0] == CLS and row[-1] == SEP and row[1] != SEP
  assert all(len(row) == seq_len for row in made[:-1])
  joined = [t for row in made for t in row[1:-1]]
  # Every token once, in order; a [SEP] only where documents change, and
  # within a row every change of document has one.
  assert [t for t in joined if t != SEP] == list(range(10, next_id))
  for row in made:
    content = row[1:-1]
    for i, t in enumerate(content):
      if t == SEP:
        assert i > 0 and content[i - 1] != SEP
        if i + 1 < len(content):
          assert doc_of_token[content[i - 1]] != doc_of_token[content[i + 1]]
      elif i + 1 < len(content) and content[i + 1] != SEP:
        assert doc_of_token[t] == doc_of_token[content[i + 1]]


def test_exact_length_needs_the_full_sentences_objective():
  with pytest.raises(ValueError, match="objective='none'"):
    inst_lib.InstanceConfig(objective="sop", exact_length=True)

# ---------------------------------------------------------------------------
# truncate_seq_pair.
# ---------------------------------------------------------------------------


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.integers(0, 40), st.integers(0, 40), st.integers(2, 50),
                  st.integers(0, 2**32 - 1))
def test_truncate_seq_pair(len_a, len_b, max_tokens, seed):
  a, b = list(range(len_a)), list(range(100, 100 + len_b))
  inst_lib.truncate_seq_pair(a, b, max_tokens, np.random.default_rng(seed))
  if len_a + len_b <= max_tokens:
    assert (len(a), len(b)) == (len_a, len_b)
    return
  assert len(a) + len(b) == max_tokens
  # Only the longer side is trimmed until both meet; the shorter side
  # keeps its length unless it exceeds half the budget.
  assert min(len(a), len(b)) == min(len_a, len_b, max_tokens // 2)
  # Each side remains a contiguous slice of itself.
  for kept, full in ((a, range(len_a)), (b, range(100, 100 + len_b))):
    if kept:
      assert kept == list(range(kept[0], kept[0] + len(kept)))
      assert set(kept) <= set(full)


def test_truncate_seq_pair_trims_both_ends():
  rng = np.random.default_rng(0)
  fronts = []
  for _ in range(400):
    a, b = list(range(20)), [100]
    inst_lib.truncate_seq_pair(a, b, 11, rng)
    assert len(a) == 10 and b == [100]
    fronts.append(a[0])  # how many were cut from the front
  # Each of the 10 cuts is front or back with probability 1/2.
  assert abs(np.mean(fronts) - 5) < 0.3


# ---------------------------------------------------------------------------
# Determinism, blocks, records, config.
# ---------------------------------------------------------------------------


def as_tuples(made):
  return [(x.tokens.tolist(), x.token_type_ids.tolist(), x.label)
          for x in made]


@pytest.mark.parametrize("objective", ["sop", "nsp", "none"])
def test_deterministic(corpus, objective):
  one, stats_one = create(corpus[:100], seed=5, objective=objective,
                          max_seq_length=40, dupe_factor=2)
  two, stats_two = create(corpus[:100], seed=5, objective=objective,
                          max_seq_length=40, dupe_factor=2)
  assert as_tuples(one) == as_tuples(two)
  assert stats_one == stats_two
  other, _ = create(corpus[:100], seed=6, objective=objective,
                    max_seq_length=40, dupe_factor=2)
  assert as_tuples(one) != as_tuples(other)


@pytest.mark.parametrize("nsp_negatives", [False, True])
def test_blocks_match_one_pass(corpus, nsp_negatives):
  """Per-document streams keyed by the global index: splitting the corpus
  into blocks gives each document the same instances (SOP mode; with NSP
  negatives only documents whose chunks never draw from the pool)."""
  cfg = inst_lib.InstanceConfig(max_seq_length=40, dupe_factor=2,
                                nsp_negatives_in_sop=nsp_negatives)
  docs = corpus[:120]
  whole, whole_stats = inst_lib.create_instances(docs, cfg, 9, CLS, SEP)
  parts, part_stats = [], inst_lib.Stats()
  for lo, hi in ((0, 50), (50, 120)):
    made, stats = inst_lib.create_instances(docs[lo:hi], cfg, 9, CLS, SEP,
                                            first_index=lo)
    parts.extend(made)
    part_stats.add(stats)

  def by_document(made):
    grouped = collections.defaultdict(list)
    for x in made:
      a, b = segments(x)
      if doc_of(a)[0] == doc_of(b)[0]:  # random-document Bs use the pool
        grouped[int(doc_of(a)[0])].append((a.tolist(), b.tolist(), x.label))
    return grouped

  got, want = by_document(parts), by_document(whole)
  if nsp_negatives:
    # A random B consumes draws, so compare documents without any.
    pooled = {int(doc_of(segments(x)[0])[0]) for x in whole
              if doc_of(segments(x)[0])[0] != doc_of(segments(x)[1])[0]}
    got = {d: v for d, v in got.items() if d not in pooled}
    want = {d: v for d, v in want.items() if d not in pooled}
    assert len(want) > 20
  else:
    assert part_stats == whole_stats
  assert got == want


def test_record_round_trip(corpus):
  made = []
  for objective in ("sop", "none"):
    made += create(corpus[:30], objective=objective, max_seq_length=40)[0]
  made.append(inst_lib.Instance(np.zeros(0, np.int32), np.zeros(0, np.int8),
                                0))
  made.append(inst_lib.Instance(np.array([CLS, 2**31 - 1, SEP], np.int32),
                                np.array([0, 0, 1], np.int8), 1))
  for x in made:
    record = inst_lib.to_bytes(x)
    assert isinstance(record, bytes)
    assert len(record) == 5 + 5 * len(x.tokens)
    y = inst_lib.from_bytes(record)
    assert y.tokens.dtype == np.int32 and y.token_type_ids.dtype == np.int8
    np.testing.assert_array_equal(y.tokens, x.tokens)
    np.testing.assert_array_equal(y.token_type_ids, x.token_type_ids)
    assert y.label == x.label


@pytest.mark.parametrize("mangle", [
    lambda r: b"",
    lambda r: r[:3],
    lambda r: r[:-1],
    lambda r: r + b"\x00",
    lambda r: r[:5],
    lambda r: r[:1] + (10**6).to_bytes(4, "little") + r[5:],
])
def test_malformed_records(mangle):
  x = inst_lib.Instance(np.array([CLS, 10, SEP, 11, SEP], np.int32),
                        np.array([0, 0, 0, 1, 1], np.int8), 1)
  with pytest.raises(ValueError):
    inst_lib.from_bytes(mangle(inst_lib.to_bytes(x)))


def test_degenerate_corpora():
  # Empty documents and a lone document yield nothing and do not crash.
  for objective in ("sop", "nsp", "none"):
    made, stats = create([[], [[BASE]]], objective=objective,
                         max_seq_length=16)
    if objective == "none":
      assert as_tuples(made) == [([CLS, BASE, SEP], [0, 0, 0], -1)]
    else:
      # No other non-empty document to draw a B from (NSP) or nothing to
      # order (SOP).
      assert made == []
    assert stats.instances == len(made)


@pytest.mark.parametrize("kwargs, match", [
    (dict(objective="mlm"), "objective"),
    (dict(max_seq_length=4), "max_seq_length"),
    (dict(short_seq_prob=-0.1), "short_seq_prob"),
    (dict(short_seq_prob=1.5), "short_seq_prob"),
    (dict(dupe_factor=0), "dupe_factor"),
])
def test_config_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    inst_lib.InstanceConfig(**kwargs)


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(st.lists(st.integers(1, 64), max_size=80),
                  st.integers(64, 96), st.integers(1, 4))
def test_pack_rows_is_a_partition_that_fits(lengths, seq_len, k):
  rows = inst_lib.pack_rows(lengths, seq_len, k)
  assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
  for r in rows:
    assert 1 <= len(r) <= k and r == sorted(r)
    assert sum(lengths[i] for i in r) <= seq_len
  assert [r[0] for r in rows] == sorted(r[0] for r in rows)
  # Best fit decreasing never opens a row for an instance that fits an
  # earlier open one: of any two rows, the later one's first-placed
  # (longest) instance did not fit the other's room with a free slot.
  if rows:
    assert inst_lib.pack_rows(lengths, seq_len, k) == rows  # deterministic
    full = -(-sum(lengths) // seq_len)
    assert len(rows) >= max(full, -(-len(lengths) // k))


def test_pack_rows_pairs_short_instances():
  # Four half rows and two full ones: 4 rows of one or two, not 6.
  rows = inst_lib.pack_rows([30, 64, 30, 34, 64, 34], 64, 2)
  assert rows == [[0, 5], [1], [2, 3], [4]]
  # K bounds a row even when tokens are left over.
  assert inst_lib.pack_rows([5] * 7, 64, 3) == [[0, 1, 2], [3, 4, 5], [6]]
  with pytest.raises(ValueError, match="more than max_seq_length"):
    inst_lib.pack_rows([65], 64, 2)


def test_packed_record_round_trip(corpus):
  made = create(corpus[:10], objective="sop", max_seq_length=40)[0]
  for row in (made[:1], made[:3], []):
    got = inst_lib.from_bytes_packed(inst_lib.to_bytes_packed(row))
    assert len(got) == len(row)
    for x, y in zip(row, got):
      np.testing.assert_array_equal(x.tokens, y.tokens)
      np.testing.assert_array_equal(x.token_type_ids, y.token_type_ids)
      assert x.label == y.label
  record = inst_lib.to_bytes_packed(made[:2])
  for bad in (b"", record[:-1], record + b"\x00", b"\x03" + record[1:]):
    with pytest.raises(ValueError):
      inst_lib.from_bytes_packed(bad)


@pytest.mark.parametrize("batch,examples,rows,multiple,want", [
    (32, 110, 32, 1, 9),    # 3.44 a row: 9.3 rows → 9
    (32, 100, 40, 1, 13),   # 2.5 a row: 12.8 → 13
    (32, 110, 32, 4, 12),   # 9, up to a multiple of 4 devices
    (4, 64, 8, 1, 1),       # 8 a row: half a row → one
    (4, 64, 8, 2, 2),
    (16, 16, 16, 1, 16),    # one a row: unchanged
])
def test_rows_per_step(batch, examples, rows, multiple, want):
  assert inst_lib.rows_per_step(batch, examples, rows, multiple) == want
