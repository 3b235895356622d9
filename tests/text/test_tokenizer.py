"""Tests for albert_jax.text.tokenizer (parity with transformers) and
albert_jax.text.train_tokenizer (training a vocabulary, its CLI)."""

import glob
import gzip
import itertools
import logging
import os
import shutil
import subprocess
import sys

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from locations import CORPUS
from locations import T5_SPM
import numpy as np
import pytest

from albert_jax.text import documents as docs_lib
from albert_jax.text import preprocess
from albert_jax.text import tokenizer as tokenizer_lib
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.tokenizer import Tokenizer

BUNDLED = CORPUS.parent  # the bundled corpus's files
TRAIN_LINES = 2500  # per bundled file; held-out lines come after these.

TEXTS = [
    "Hello, world!", "café naïve Ångström", "CAFÉ Naïve ÅNGSTRÖM",
    "日本語のテキスト 中文", "emoji 😀🎉 ok 👍🏽", "It cost 9,000 dollars.",
    "1,234,567 people in 1,000, 2,000, 30,", "``quoted'' text",
    "He said ``hi'' and '' left", "a   b\t\tc\nd\r\ne", "", "   ", "\n\t",
    "  leading and trailing  ", "ﬁ ligature ① ２３ Ⅻ",
    "non\u00a0breaking\u3000space\u2009thin", "don't stop; x=1 < y > z",
    "The U.S. economy grew 3.5% in 1999 -- £5 or €6?", "Straße İstanbul ǅ",
]


def _corpus_lines(name, start, stop):
  with gzip.open(BUNDLED / name, "rt", encoding="utf-8") as f:
    return [l.rstrip("\n") for l in itertools.islice(f, start, stop)]


def _official_split(sp_encode, pieces):
  """albert/tokenization.py encode_pieces, applied to unsplit pieces."""
  out = []
  for piece in pieces:
    if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
      cur = sp_encode(piece[:-1].replace("\u2581", ""))
      if piece[0] != "\u2581" and cur[0][0] == "\u2581":
        cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:]] + cur[1:]
      out += cur + [piece[-1]]
    else:
      out.append(piece)
  return out


def _hf_albert(model_path, tmp_dir, **kwargs):
  # The reference implementation is optional (the "hf" extra).
  transformers = pytest.importorskip("transformers")
  os.makedirs(tmp_dir, exist_ok=True)
  shutil.copy(model_path, os.path.join(tmp_dir, "spiece.model"))
  # AlbertTokenizer(vocab_file=...) ignores the file in transformers v5.
  return transformers.AlbertTokenizer.from_pretrained(tmp_dir, **kwargs)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Official format: sentence per line, blank line between documents, gz."""
  d = tmp_path_factory.mktemp("corpus")
  for name in sorted(os.listdir(BUNDLED)):
    with gzip.open(d / name, "wt", encoding="utf-8") as f:
      f.write("\n".join(_corpus_lines(name, 0, TRAIN_LINES)) + "\n")
  # A document of grouped numbers, so the vocabulary learns "▁1,"-style
  # pieces and the official digit-comma split has something to split.
  rng = np.random.default_rng(0)
  numbers = [f"In {y} the fund paid {a:,} dollars, or {b:,}, to 1,{c:03d}."
             for y, a, b, c in rng.integers(1, 10**6, (400, 4))]
  with gzip.open(d / "numbers.txt.gz", "wt", encoding="utf-8") as f:
    f.write("\n".join(numbers) + "\n")
  return str(d / "*.txt.gz")


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("spm") / "albert.model"
  return text_train.train(corpus, 2000, output=out, seed=7, num_threads=4)


@pytest.fixture(scope="module")
def heldout():
  return _corpus_lines("python_docs.txt.gz", 40000, 40150) + _corpus_lines(
      "sotu.txt.gz", 30000, 30150)


def test_trained_special_ids(trained):
  assert trained.vocab_size == 2000
  assert (trained.pad_id, trained.unk_id, trained.cls_id, trained.sep_id,
          trained.mask_id) == (0, 1, 2, 3, 4)
  assert [trained.id_to_piece(i) for i in range(5)] == [
      "<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
  assert trained.piece_to_id("[MASK]") == 4
  assert trained.train_stats["sentences"] > 7000
  assert trained.train_stats["non_utf8"] == trained.train_stats["too_long"] == 0


@pytest.mark.parametrize("lower,accents", [(True, False), (False, False),
                                           (True, True), (False, True)])
def test_encode_matches_hf_albert(trained, heldout, tmp_path, lower, accents):
  tok = Tokenizer.from_file(trained.path, do_lower_case=lower,
                            keep_accents=accents)
  hf = _hf_albert(trained.path, tmp_path, do_lower_case=lower,
                  keep_accents=accents)
  sp_encode = lambda s: tok.sp_model.encode(s, out_type=str)
  n_split = 0
  for text in TEXTS + heldout:
    hf_ids = hf(text, add_special_tokens=False)["input_ids"]
    hf_pieces = hf.convert_ids_to_tokens(hf_ids)
    expected = _official_split(sp_encode, hf_pieces)
    # Unknown characters: tokenize keeps their surface (as spm and the
    # official code do) where HF writes "<unk>"; the ids agree.
    assert [tok.piece_to_id(p) for p in tok.tokenize(text)] == [
        tok.piece_to_id(p) for p in expected], text
    assert tok.encode(text) == [tok.piece_to_id(p) for p in expected], text
    if expected == hf_pieces:
      assert tok.encode(text) == hf_ids, text
    else:
      n_split += 1
  # The digit-comma split must really have been exercised.
  assert n_split >= 1


def test_misfit_is_the_one_fits_the_model_check(trained):
  """Every caller (pre-training, fine-tuning, prediction, the loaded
  encoder) words its refusal around this: more pieces than the model
  embeds never fit; fewer fit a loaded model, not a run that sizes the
  model for the tokenizer."""
  n = trained.vocab_size
  assert tokenizer_lib.misfit(trained, n) is None and tokenizer_lib.misfit(trained, n, exact=True) is None
  assert tokenizer_lib.misfit(trained, n + 5) is None
  assert tokenizer_lib.misfit(trained, n - 1) == (
      f"has {n} pieces but the model embeds {n - 1} ids ([0, {n - 2}]), so "
      f"its ids from {n - 1} on would be misread")
  assert tokenizer_lib.misfit(trained, n + 5, exact=True) == (
      f"has {n} pieces but the model embeds {n + 5} ids, so 5 rows of its "
      "table would never be read")


def test_digit_comma_split(trained):
  pieces = trained.tokenize("9,000 and 1,234,567")
  assert not any(len(p) > 1 and p.endswith(",") and p[-2].isdigit()
                 for p in pieces)
  assert trained.decode(trained.encode("9,000 and 1,234,567")) == (
      "9,000 and 1,234,567")


def test_official_preprocessing_where_hf_v5_differs(trained):
  """Cases where we follow albert/tokenization.py rather than HF v5."""
  assert trained.encode("") == trained.encode(" \t\n ") == []
  # Literal "[MASK]" text is not the control id (spm never matches them).
  assert trained.mask_id not in trained.encode("the [MASK] sat")
  # Python's str.split() whitespace (\x0b, \x1c...) separates words.
  assert trained.tokenize("ab\x1ccd") == trained.tokenize("ab cd")
  # Only marks with a combining class are stripped (unicodedata.combining).
  assert trained.normalize("cafe\u0301 \u1732") == "cafe \u1732"


def test_t5_model_has_no_albert_specials():
  tok = Tokenizer.from_file(T5_SPM)
  assert tok.vocab_size == 32101 and (tok.pad_id, tok.unk_id) == (0, 3)
  assert tok.cls_id is None and tok.sep_id is None and tok.mask_id is None
  with pytest.raises(ValueError, match=r"no \[CLS\]/\[SEP\]"):
    tok.encode_pair("a", "b")
  # Control pieces (<pad>, </s>, <s>) and <unk> count as word starts.
  np.testing.assert_array_equal(tok.is_word_start([0, 1, 2, 3]), [1] * 4)


def test_t5_model_matches_hf(tmp_path):
  tok = Tokenizer.from_file(T5_SPM)
  hf = _hf_albert(T5_SPM, tmp_path, cls_token="<s>", sep_token="</s>",
                  mask_token="<unk>")
  sp_encode = lambda s: tok.sp_model.encode(s, out_type=str)
  for text in TEXTS:
    # transformers v5 AlbertTokenizer hard-codes unk_id=1 ("</s>" here).
    hf_ids = [tok.unk_id if i == 1 else i
              for i in hf(text, add_special_tokens=False)["input_ids"]]
    expected = _official_split(sp_encode, hf.convert_ids_to_tokens(hf_ids))
    assert tok.encode(text) == [tok.piece_to_id(p) for p in expected], text


PAIRS = [("the first sentence is rather long compared to the second", "short"),
         ("tiny", "the second sentence is the long one in this pair"),
         ("equal length words here", "and equal length there"),
         ("", "only b"), ("only a", "")]


@pytest.mark.parametrize("max_length", [None, 3, 4, 5, 6, 7, 9, 12, 20, 64])
def test_encode_pair_matches_hf(trained, tmp_path, max_length):
  hf = _hf_albert(trained.path, tmp_path)
  kw = dict(truncation="longest_first" if max_length else False,
            max_length=max_length, return_token_type_ids=True)
  for a, b in PAIRS:
    for second in (b, None):
      if (second is None and max_length == 3) or second == "":
        continue  # HF treats b="" as no pair; we keep [CLS] a [SEP] [SEP].
      ours = trained.encode_pair(a, second, max_length=max_length)
      theirs = hf(a, second, **kw)
      for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[key] == theirs[key], (a, second, max_length, key)
      if max_length:
        assert len(ours["input_ids"]) <= max_length
  assert trained.encode_pair("a", "")["token_type_ids"] == [0, 0, 0, 1]
  with pytest.raises(ValueError, match="max_length"):
    trained.encode_pair("a", "b", max_length=2)


def test_decode_round_trip(trained):
  for text in ["Hello, world! The year was 1999.",
               "  The   President said: \"we will act.\"  ",
               "It cost 9,000 dollars, not 12,500."]:
    ids = trained.encode(text)
    assert trained.decode(ids) == trained.normalize(text)
    assert trained.decode(np.array(ids)) == trained.normalize(text)
  pair = trained.encode_pair("hello there", "general")
  assert trained.decode(pair["input_ids"]) == "hello there general"
  assert trained.decode(pair["input_ids"], skip_special_tokens=False) == (
      "[CLS] hello there [SEP] general [SEP]")


def test_is_word_start_rule():
  rule = preprocess.is_start_piece
  starts = ["\u2581the", "\u2581", "<unk>", "<0x41>", ",", "(", "000", "9",
            "'s", "é", "日本", "x=", "€"]
  non_starts = ["ing", "s", "Ing", "ab,", "..", "a-b", "[cls]"]
  assert all(rule(p) for p in starts), [p for p in starts if not rule(p)]
  assert not any(rule(p) for p in non_starts)


def test_is_word_start_vectorised(trained):
  cont = next(i for i in range(5, trained.vocab_size)
              if trained.id_to_piece(i).isalpha()
              and trained.id_to_piece(i).islower())
  word = trained.piece_to_id("\u2581the")
  comma = trained.piece_to_id(",")
  ids = np.array([[0, 1, 2, 3], [4, cont, word, comma]])
  flags = trained.is_word_start(ids)
  assert flags.dtype == bool and flags.shape == (2, 4)
  np.testing.assert_array_equal(flags, [[1, 1, 1, 1], [1, 0, 1, 1]])
  # Every id agrees with the official rule except the control pieces.
  every = trained.is_word_start(np.arange(trained.vocab_size))
  rule = [preprocess.is_start_piece(trained.id_to_piece(i))
          for i in range(trained.vocab_size)]
  assert np.array_equal(every[5:], rule[5:])


@pytest.fixture(scope="module")
def bert_vocab(tmp_path_factory):
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick",
           "brown", "fox", "jump", "##s", "##ed", "##ing", "over", "lazy",
           "dog", "cafe", "naive", "un", "##aff", "##able", "a", "b", "c",
           "##a", "##b", "##c", ",", ".", "!", "'", "9", "000", "##0", "日",
           "本", "hello", "world", "Hello", "The", "caf", "##é", "é"]
  d = tmp_path_factory.mktemp("bert")
  (d / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
  return d


BERT_TEXTS = ["The quick brown fox jumps over the lazy dog!",
              "unaffable 日本 café naïve", "Hello, World. 9,000 !!",
              "", "  jumped\tjumping\n", "unknownword c'a'b"]


@pytest.mark.parametrize("lower", [True, False])
def test_wordpiece_matches_bert_tokenizer_fast(bert_vocab, lower, tmp_path):
  transformers = pytest.importorskip("transformers")
  hf = transformers.BertTokenizerFast.from_pretrained(str(bert_vocab), do_lower_case=lower)
  tok = Tokenizer.from_file(bert_vocab / "vocab.txt", do_lower_case=lower)
  assert not tok.is_sentencepiece
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (
      0, 1, 2, 3, 4)
  tok.save(tmp_path)
  reloaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
  for text in BERT_TEXTS:
    ids = hf(text, add_special_tokens=False)["input_ids"]
    assert tok.encode(text) == ids, text
    assert reloaded.encode(text) == ids, text
    assert tok.tokenize(text) == hf.tokenize(text)
  for max_length in (None, 4, 7, 11):
    kw = dict(truncation=bool(max_length), max_length=max_length,
              return_token_type_ids=True)
    ours, theirs = tok.encode_pair(*BERT_TEXTS[:2], max_length), hf(
        *BERT_TEXTS[:2], **kw)
    for key in ours:
      assert ours[key] == theirs[key], (max_length, key)
  assert tok.decode(tok.encode("the quick fox jumps")) == "the quick fox jumps"
  np.testing.assert_array_equal(
      tok.is_word_start([2, 5, 10, 9, 10, 1]), [1, 1, 0, 1, 0, 1])


def test_hf_tokenizer_json_unigram(trained, tmp_path):
  """HF's own tokenizer.json (no digit-comma split) loads through tokenizers."""
  hf = _hf_albert(trained.path, tmp_path / "src")
  hf.save_pretrained(tmp_path / "hf")
  tok = Tokenizer.from_file(tmp_path / "hf" / "tokenizer.json")
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (
      0, 1, 2, 3, 4)
  for text in TEXTS:
    assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
  # Unigram pieces use the SentencePiece word-start rule, not "##".
  ids = np.arange(trained.vocab_size)
  np.testing.assert_array_equal(tok.is_word_start(ids),
                                trained.is_word_start(ids))


def test_wordpiece_without_specials(tmp_path):
  pytest.importorskip("tokenizers")
  (tmp_path / "vocab.txt").write_text("[UNK]\nhello\n##s\n", encoding="utf-8")
  tok = Tokenizer.from_file(tmp_path / "vocab.txt")
  assert tok.unk_id == 0 and tok.pad_id is None and tok.cls_id is None
  assert tok.encode("hellos x") == [1, 2, 0]
  with pytest.raises(ValueError, match="CLS"):
    tok.encode_pair("hello")


def test_save_and_find_in(trained, tmp_path):
  assert Tokenizer.find_in(tmp_path) is None
  cased = Tokenizer.from_file(trained.path, do_lower_case=False)
  path = cased.save(tmp_path / "ckpt")
  assert os.path.basename(path) == "spiece.model"
  found = Tokenizer.find_in(tmp_path / "ckpt")
  assert not found.do_lower_case
  assert found.encode("Hello World") == cased.encode("Hello World")
  # A bare *.model (e.g. the official 30k-clean.model) is found too.
  shutil.copy(trained.path, tmp_path / "30k-clean.model")
  assert Tokenizer.find_in(tmp_path).encode("x y") == trained.encode("x y")
  from_dir = Tokenizer.from_file(tmp_path / "ckpt")
  assert from_dir.vocab_size == 2000 and not from_dir.do_lower_case
  assert Tokenizer.from_file(tmp_path / "ckpt", do_lower_case=True).encode(
      "Hello") == trained.encode("Hello")


def test_reservoir_sample_is_deterministic_and_bounded():
  items = [str(i) for i in range(1000)]
  a = text_train.reservoir_sample(iter(items), 50, seed=1)
  assert a == text_train.reservoir_sample(iter(items), 50, seed=1)
  assert a != text_train.reservoir_sample(iter(items), 50, seed=2)
  assert len(a) == 50 and len(set(a)) == 50
  assert a == sorted(a, key=int)  # input order is kept
  assert text_train.reservoir_sample(iter(items[:10]), 50, 0) == items[:10]


def _small_corpus(path, extra=b""):
  """600 lines of SOTU (some blank: document breaks) plus `extra` bytes."""
  lines = _corpus_lines("sotu.txt.gz", 0, 600)
  path.write_bytes("\n".join(lines).encode() + b"\n\n" + extra)
  return path, sum(bool(l.strip()) for l in lines)


def test_train_samples_input(tmp_path):
  src, n = _small_corpus(tmp_path / "c.txt")
  tok = text_train.train(src, 300, output=tmp_path / "m",
                         input_sentence_size=200, num_threads=2)
  assert tok.path == str(tmp_path / "m.model")
  assert tok.train_stats["sampled"] == 200
  assert tok.train_stats["sentences"] == n
  again = text_train.train(src, 300, output=tmp_path / "m2",
                           input_sentence_size=200, num_threads=2)
  # Same seed, same model (the files differ only in the recorded prefix).
  vocab = lambda t: [(t.id_to_piece(i), t.sp_model.get_score(i))
                     for i in range(t.vocab_size)]
  assert vocab(tok) == vocab(again)


def test_train_rejects_empty_corpus(tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n   \n", encoding="utf-8")
  with pytest.raises(ValueError, match="empty.txt"):
    text_train.train(empty, 100, output=tmp_path / "m.model")
  # Corpora are found by text.documents.expand_paths, as the data
  # pipeline's are.
  with pytest.raises(FileNotFoundError, match="nothing-here"):
    text_train.train(str(tmp_path / "nothing-here*.txt"), 100,
                     output=tmp_path / "m.model")


def test_train_skips_bad_lines_with_one_summary(tmp_path, caplog):
  """Corpora are read by text.documents: a skipped line is logged (the first
  few of them), and one summary counts every kind."""
  bad = b"caf\xe9 latin-1\n" * 3 + b"\xff\xfe\x00\n"
  huge = b"x" * (docs_lib.MAX_LINE_BYTES + 10) + b"\n"
  src, n = _small_corpus(tmp_path / "c.txt", bad + huge + b"ok line\n")
  with caplog.at_level(logging.WARNING, logger=docs_lib.__name__):
    tok = text_train.train(src, 300, output=tmp_path / "m.model",
                           num_threads=2)
  messages = [r.getMessage() for r in caplog.records]
  assert sum("not valid UTF-8" in m for m in messages) == 4, messages
  assert sum("line longer than" in m for m in messages) == 1, messages
  summaries = [m for m in messages if m.startswith("Skipped ")]
  assert len(summaries) == 1, messages
  assert summaries[0].startswith(
      f"Skipped 4 line(s) that are not UTF-8, 1 line(s) over "
      f"{docs_lib.MAX_LINE_BYTES} bytes,"), summaries
  assert tok.train_stats["non_utf8"] == 4
  assert tok.train_stats["too_long"] == 1
  assert tok.train_stats["sentences"] == n + 1


def test_cli_trains_a_model(tmp_path):
  _, n = _small_corpus(tmp_path / "a.txt")
  moby = [l for l in _corpus_lines("moby_dick.txt.gz", 0, 300) if l.strip()]
  with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
    f.write("\n".join(moby) + "\n")
  out = tmp_path / "out" / "cli.model"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = subprocess.run(
      [sys.executable, "-m", "albert_jax.text.train_tokenizer", "--input",
       str(tmp_path / "*.txt*"), "--vocab_size", "400", "--output", str(out),
       "--num_threads", "2", "--user_symbols", "albert"],
      capture_output=True, text=True, env=env, timeout=120, check=False)
  assert run.returncode == 0, run.stderr
  assert "Wrote" in run.stdout, run.stdout
  assert f"{n + len(moby)} sentences" in run.stdout, run.stdout
  tok = Tokenizer.from_file(out)
  assert tok.vocab_size == 400 and tok.cls_id == 2
  # User symbols are never split or merged.
  assert tok.tokenize("a.b") == ["\u2581a", ".", "b"]
  assert glob.glob(str(tmp_path / "out" / "cli.vocab"))



def test_cli_reports_bad_input(tmp_path, capsys):
  rc = text_train.main(["--input", str(tmp_path / "none*.txt"),
                        "--output", str(tmp_path / "x.model")])
  assert rc == 2 and "none*.txt" in capsys.readouterr().err


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80))
def test_encode_decode_never_raise(trained, text):
  ids = trained.encode(text)
  assert all(0 <= i < trained.vocab_size for i in ids)
  assert isinstance(trained.decode(ids), str)
  assert trained.is_word_start(ids).shape == (len(ids),)
  pair = trained.encode_pair(text, text, max_length=16)
  assert len(pair["input_ids"]) <= 16
