"""Property tests on arbitrary input: tokenizers, instances, masking.

Hypothesis draws the input; every property is exact:

- Tokenizers (a trained SentencePiece model and a WordPiece vocab.txt) on
  any Unicode text: control and format characters, astral-plane characters,
  empty strings, words thousands of characters long. `encode` returns ids
  of the vocabulary, `decode` returns text, and `encode_pair` is always
  [CLS] a' [SEP] (b' [SEP]) with a', b' prefixes of the encodings, cut
  longest-first to exactly `max_length`.
- Instances from random documents (any sentence lengths, empty documents,
  every objective): never over max_seq_length, [CLS] first and [SEP] last,
  token types 0 through the first [SEP] and 1 after, and each segment a
  contiguous run of one document, in order for label 0 and swapped for 1.
- Masking of those instances, batched and padded as the loader does: fixed
  shapes, at most max_predictions targets, never [CLS], [SEP] or padding,
  positions/ids/weights consistent with the input, and a row's mask
  independent of its batch.
- `truncate_seq_pair` against the official one-token-at-a-time loop: the
  same tokens kept and the same random draws consumed.
"""

import gzip
import itertools

import hypothesis
from hypothesis import strategies as st
from locations import CORPUS
import numpy as np
import pytest

from albert_jax.data import instances as inst_lib
from albert_jax.data import masking
from albert_jax.data.row_random import row_keys
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.tokenizer import Tokenizer

FUZZ = hypothesis.settings(max_examples=60, deadline=None)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
  d = tmp_path_factory.mktemp("spm")
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    (d / "corpus.txt").write_text("".join(itertools.islice(f, 300)),
                                  encoding="utf-8")
  return text_train.train(str(d / "corpus.txt"), 300,
                          output=d / "spiece.model", seed=1, num_threads=1)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
  words = ["the", "state", "union", "##ing", "##ed", "9", ",", "."]
  chars = [chr(c) for c in range(ord("a"), ord("z") + 1)]
  vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + chars
           + ["##" + c for c in chars])
  path = tmp_path_factory.mktemp("wp") / "vocab.txt"
  path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
  return Tokenizer.from_file(str(path))


@pytest.fixture(scope="module", params=["sentencepiece", "wordpiece"])
def tokenizer(request):
  return request.getfixturevalue(request.param)


# Surrogates (category Cs) are not text: Python cannot even encode them.
ANY_CHAR = st.characters(exclude_categories=("Cs",))
ODD_CHAR = st.one_of(
    st.characters(categories=("Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Co")),
    st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF,
                  exclude_categories=("Cs", "Cn")),
    st.sampled_from("aZ9,.'\"``'' \t\n\r\u00e9\u2581"))
TEXT = st.one_of(
    st.just(""),
    st.text(ANY_CHAR, max_size=60),
    st.text(ODD_CHAR, max_size=60),
    # One very long "word", and a long run of one character.
    st.text(st.sampled_from("abcdefghij\u00e9"), min_size=500,
            max_size=3000),
    st.builds(lambda c, n: c * n, ANY_CHAR, st.integers(1000, 5000)),
)


@FUZZ
@hypothesis.given(text=TEXT)
def test_encode_decode_never_raise(tokenizer, text):
  ids = tokenizer.encode(text)
  assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size
             for i in ids)
  assert isinstance(tokenizer.decode(ids), str)
  assert isinstance(tokenizer.decode(ids, skip_special_tokens=False), str)
  assert tokenizer.is_word_start(ids).shape == (len(ids),)
  assert tokenizer.tokenize(text) is not None


@FUZZ
@hypothesis.given(ids=st.lists(st.integers(0, 299), max_size=200))
def test_decode_any_ids(sentencepiece, ids):
  assert isinstance(sentencepiece.decode(ids), str)
  assert isinstance(sentencepiece.decode(ids, skip_special_tokens=False), str)


@FUZZ
@hypothesis.given(a=TEXT, b=st.one_of(st.none(), TEXT),
                  max_length=st.integers(0, 40))
def test_encode_pair_fits_max_length(tokenizer, a, b, max_length):
  cls, sep = tokenizer.cls_id, tokenizer.sep_id
  specials = 2 if b is None else 3
  if max_length < specials:
    with pytest.raises(ValueError, match="max_length"):
      tokenizer.encode_pair(a, b, max_length=max_length)
    return
  out = tokenizer.encode_pair(a, b, max_length=max_length)
  ids, types = out["input_ids"], out["token_type_ids"]
  assert len(ids) <= max_length
  assert len(types) == len(out["attention_mask"]) == len(ids)
  assert set(out["attention_mask"]) == {1}
  ids_a = tokenizer.encode(a)
  budget = max_length - specials
  if b is None:
    assert ids == [cls] + ids_a[:budget] + [sep]
    assert types == [0] * len(ids)
    return
  ids_b = tokenizer.encode(b)
  n1 = types.count(0) - 2
  n2 = len(ids) - n1 - 3
  assert types == [0] * (n1 + 2) + [1] * (n2 + 1)
  assert ids == [cls] + ids_a[:n1] + [sep] + ids_b[:n2] + [sep]
  # Longest first: the budget is filled, and the shorter side keeps all
  # it has up to half of it.
  assert n1 + n2 == min(len(ids_a) + len(ids_b), budget)
  assert min(n1, n2) == min(len(ids_a), len(ids_b), budget // 2)


################################################################################
# Instances and masking.
################################################################################

CLS, SEP, PAD, MASK = 2, 3, 0, 4
STRIDE = 10_000  # document d's tokens are 10 + d·STRIDE + their position


@st.composite
def corpora(draw):
  """Documents of sentences whose ids name their document and position."""
  lengths = draw(st.lists(
      st.lists(st.integers(1, 90), max_size=8), min_size=1, max_size=6))
  documents = []
  for d, sentence_lengths in enumerate(lengths):
    ends = np.cumsum([0] + sentence_lengths)
    documents.append([list(range(10 + d * STRIDE + s, 10 + d * STRIDE + e))
                      for s, e in zip(ends[:-1], ends[1:])])
  config = inst_lib.InstanceConfig(
      max_seq_length=draw(st.integers(5, 64)),
      short_seq_prob=draw(st.sampled_from([0.0, 0.1, 1.0])),
      objective=draw(st.sampled_from(inst_lib.OBJECTIVES)),
      nsp_negatives_in_sop=draw(st.booleans()),
      dupe_factor=draw(st.integers(1, 2)))
  return documents, config, draw(st.integers(0, 2**32 - 1))


def _segment(tokens):
  """(document, first position, last position) of a contiguous segment."""
  docs = {(t - 10) // STRIDE for t in tokens}
  assert len(docs) == 1, tokens
  positions = [(t - 10) % STRIDE for t in tokens]
  assert positions == list(range(positions[0], positions[0] + len(tokens)))
  return docs.pop(), positions[0], positions[-1]


@FUZZ
@hypothesis.given(case=corpora())
def test_instances_keep_their_shape(case):
  documents, config, seed = case
  made, stats = inst_lib.create_instances(documents, config, seed, CLS, SEP)
  assert stats.instances == len(made)
  for inst in made:
    tokens = inst.tokens.tolist()
    types = inst.token_type_ids.tolist()
    assert 3 <= len(tokens) <= config.max_seq_length
    assert len(types) == len(tokens)
    assert tokens[0] == CLS and tokens[-1] == SEP
    assert CLS not in tokens[1:]
    if config.objective == "none":
      assert inst.label == -1 and set(types) == {0}
      assert tokens[1] != SEP
      assert all(not (x == SEP and y == SEP) for x, y in zip(tokens,
                                                             tokens[1:]))
      continue
    assert tokens.count(SEP) == 2 and inst.label in (0, 1)
    first_sep = tokens.index(SEP)
    a, b = tokens[1:first_sep], tokens[first_sep + 1:-1]
    assert a and b
    assert types == [0] * (first_sep + 1) + [1] * (len(b) + 1)
    doc_a, start_a, end_a = _segment(a)
    doc_b, start_b, end_b = _segment(b)
    random_next = config.objective == "nsp" or config.nsp_negatives_in_sop
    if doc_a != doc_b:  # only a random next segment leaves the document
      assert random_next and inst.label == 1
    elif inst.label == 0:
      assert end_a < start_b
    else:  # swapped (SOP)
      assert config.objective == "sop" and end_b < start_a


def _pack(made, seq_len):
  """Instances → padded [B, T] arrays, as the loader does."""
  ids = np.full((len(made), seq_len), PAD, np.int32)
  attention = np.zeros((len(made), seq_len), np.int32)
  for row, inst in enumerate(made):
    ids[row, :len(inst.tokens)] = inst.tokens
    attention[row, :len(inst.tokens)] = 1
  return ids, attention


@FUZZ
@hypothesis.given(case=corpora(), data=st.data())
def test_masking_random_instances(case, data):
  documents, config, seed = case
  made, _ = inst_lib.create_instances(documents, config, seed, CLS, SEP)
  hypothesis.assume(made)
  vocab_size = 10 + len(documents) * STRIDE
  seq_len = config.max_seq_length
  ids, attention = _pack(made, seq_len)
  rng = np.random.default_rng(seed)
  word_start = rng.random(vocab_size) < data.draw(
      st.sampled_from([0.3, 0.8, 1.0]))
  special = np.zeros(vocab_size, bool)
  special[[PAD, CLS, SEP, MASK]] = True
  mask_config = masking.MaskingConfig(
      max_predictions=data.draw(st.integers(1, 24)),
      masked_lm_prob=data.draw(st.sampled_from([0.05, 0.15, 0.5])),
      max_ngram=data.draw(st.integers(1, 4)),
      favor_shorter_ngram=data.draw(st.booleans()),
      whole_word=data.draw(st.booleans()))
  p = mask_config.max_predictions
  keys = row_keys(seed, data.draw(st.integers(0, 3)), np.arange(len(made)))

  def mask(ids, attention, keys):
    return masking.mask_batch(ids, attention, keys, word_start=word_start,
                              special=special, mask_id=MASK,
                              vocab_size=vocab_size, config=mask_config)

  out = mask(ids, attention, keys)
  assert out["input_ids"].shape == (len(made), seq_len)
  for name, dtype in (("masked_positions", np.int32), ("masked_ids", np.int32),
                      ("masked_weights", np.float32)):
    assert out[name].shape == (len(made), p) and out[name].dtype == dtype
  weighted = out["masked_weights"] > 0
  assert set(np.unique(out["masked_weights"])) <= {0.0, 1.0}
  assert (np.diff(weighted.astype(np.int8), axis=1) <= 0).all()
  assert (out["masked_positions"][~weighted] == 0).all()
  assert (out["masked_ids"][~weighted] == 0).all()
  for row in range(len(made)):
    pos = out["masked_positions"][row][weighted[row]]
    n = len(made[row].tokens)
    assert (np.diff(pos) > 0).all() and len(pos) <= p
    assert len(pos) <= max(1, round(n * mask_config.masked_lm_prob))
    # Never [CLS], [SEP] or padding; the labels are the original ids.
    assert ((pos > 0) & (pos < n)).all()
    assert not np.isin(ids[row, pos], [CLS, SEP, PAD, MASK]).any()
    np.testing.assert_array_equal(out["masked_ids"][row][weighted[row]],
                                  ids[row, pos])
    # Only the chosen positions may change; specials and padding never.
    changed = np.flatnonzero(out["input_ids"][row] != ids[row])
    assert set(changed) <= set(pos)
  # A row's mask depends on its key alone, not on the batch around it.
  order = np.random.default_rng(seed + 1).permutation(len(made))
  shuffled = mask(ids[order], attention[order], keys[order])
  for name in out:
    np.testing.assert_array_equal(shuffled[name], out[name][order])


def _official_truncate(a, b, max_tokens, rng):
  while len(a) + len(b) > max_tokens:
    longer = a if len(a) > len(b) else b
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(len_a=st.integers(0, 300), len_b=st.integers(0, 300),
                  max_tokens=st.integers(0, 200),
                  seed=st.integers(0, 2**32 - 1))
def test_truncate_seq_pair_is_the_official_loop(len_a, len_b, max_tokens,
                                                 seed):
  a, b = list(range(len_a)), list(range(1000, 1000 + len_b))
  want_a, want_b = list(a), list(b)
  rng, want_rng = np.random.default_rng(seed), np.random.default_rng(seed)
  inst_lib.truncate_seq_pair(a, b, max_tokens, rng)
  _official_truncate(want_a, want_b, max_tokens, want_rng)
  assert (a, b) == (want_a, want_b)
  assert rng.random() == want_rng.random()  # the same draws consumed
