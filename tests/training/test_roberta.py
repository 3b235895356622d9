"""RoBERTa as a configuration: the byte-level BPE tokenizer (ids, offsets and
files equal to transformers' RobertaTokenizerFast), its training, and
configs/roberta_base.py trained end to end through the CLI, its data packed
as full sentences and masked afresh every epoch, then exported to HF."""

import gzip
import json
import math
import os
import subprocess
import sys

from array_record.python import array_record_module
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import albert_jax
from albert_jax import Albert
from albert_jax import ModelConfig
from albert_jax.data import instances as instances_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import masking
from albert_jax.data import pipeline
from albert_jax.data.row_random import row_keys
from albert_jax.interop import hf_config as hf_config_lib
from albert_jax.text import run_tokenizer
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.tokenizer import Tokenizer
from locations import CONFIGS
from locations import CORPUS
from locations import REPO

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()

CORPUS_DIR = CORPUS.parent  # the bundled corpora
VOCAB = 1000  # configs/roberta_base.py:size=tiny
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

TRICKY = [
    "Hello world", " Hello world", "Hello world ", "  two  spaces  ",
    "", " ", "\n", "line one\nline two\n\n", "tabs\tand\r\nCRLF",
    "café naïve Ångström", "cafe\u0301 (combining)", "日本語のテキスト 中文",
    "emoji 😀🎉 ok 👍🏽 family 👨‍👩‍👧", "It cost 9,000 dollars in 1999.",
    "3.14159 and 2,718,281 and 0x1F", "don't stop; x=1 < y > z",
    "The <mask> sat.", "The<mask>sat", "two  <mask> spaces", "<mask>",
    "<s>a</s> b <pad> <unk>", "Ġ is a letter here", "مرحبا بالعالم",
    "\u200b zero\u200bwidth \ufeff bom", "non\u00a0breaking\u3000space",
]


def _lines(name, start, stop):
  out = []
  with gzip.open(CORPUS_DIR / name, "rt", encoding="utf-8") as f:
    for i, line in enumerate(f):
      if i >= stop:
        break
      if i >= start:
        out.append(line.rstrip("\n"))
  return out


def _bytes_to_unicode():
  """GPT-2's byte → symbol table, written out independently."""
  keep = (list(range(ord("!"), ord("~") + 1))
          + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
  table, extra = {}, 0
  for b in range(256):
    if b in keep:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


SYMBOL_TO_BYTE = {s: b for b, s in _bytes_to_unicode().items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """45 documents in the official format from the three bundled books."""
  path = tmp_path_factory.mktemp("corpus") / "corpus.txt.gz"
  with gzip.open(path, "wt", encoding="utf-8") as g:
    for name, stop in (("moby_dick.txt.gz", 700), ("sotu.txt.gz", 900),
                       ("python_docs.txt.gz", 1200)):
      g.write("\n".join(_lines(name, 0, stop)) + "\n\n")
  return str(path)


@pytest.fixture(scope="module")
def bpe(corpus, tmp_path_factory):
  return text_train.train(corpus, VOCAB, kind="bpe",
                         output=tmp_path_factory.mktemp("bpe") / "tok")


@pytest.fixture(scope="module")
def hf_tok(bpe):
  """RobertaTokenizerFast from the same vocab.json + merges.txt, with
  roberta-base's `<mask>` (lstrip), which transformers v5 leaves out when
  building from these two files."""
  directory = os.path.dirname(bpe.path)
  return transformers.RobertaTokenizerFast(
      vocab=os.path.join(directory, "vocab.json"),
      merges=os.path.join(directory, "merges.txt"),
      mask_token=tokenizers.AddedToken("<mask>", lstrip=True, rstrip=False,
                                       normalized=False, special=True))


@pytest.fixture(scope="module")
def heldout():
  """Real text the vocabulary was not trained on."""
  return (_lines("moby_dick.txt.gz", 5000, 5100)
          + _lines("sotu.txt.gz", 30000, 30100)
          + _lines("python_docs.txt.gz", 40000, 40100))


# --------------------------------------------------------------------------
# The tokenizer.


def test_trained_vocabulary(bpe):
  assert bpe.is_bpe and not bpe.is_sentencepiece
  assert bpe.vocab_size == VOCAB
  assert [bpe.id_to_piece(i) for i in range(5)] == SPECIALS
  assert (bpe.cls_id, bpe.pad_id, bpe.sep_id, bpe.unk_id, bpe.mask_id) == (
      0, 1, 2, 3, 4)
  # Every byte has its symbol, so no text needs <unk>.
  for symbol in SYMBOL_TO_BYTE:
    assert bpe.piece_to_id(symbol) != bpe.unk_id, symbol
  assert bpe.train_stats["sentences"] > 2000
  assert bpe.train_stats["non_utf8"] == bpe.train_stats["too_long"] == 0


def test_ids_match_roberta_tokenizer_fast(bpe, hf_tok, heldout):
  for text in TRICKY + heldout:
    want = hf_tok(text, add_special_tokens=False)["input_ids"]
    assert bpe.encode(text) == want, text
    assert bpe.tokenize(text) == hf_tok.tokenize(text), text
    assert bpe.decode(want) == hf_tok.decode(want, skip_special_tokens=True)
    assert bpe.decode(want, skip_special_tokens=False) == hf_tok.decode(want)
  # A sentence-initial word differs from the same word after a space.
  assert bpe.encode("Hello")[0] != bpe.encode(" Hello")[0]
  # <mask> takes the space before it, as roberta-base's tokenizer does.
  assert bpe.encode("a <mask>") == bpe.encode("a") + [bpe.mask_id]


PAIRS = [("the first sentence is rather long compared to the second", "short"),
         ("tiny", "the second sentence is the long one in this pair"),
         ("equal length words here", "and equal length there"),
         ("only a", None)]


@pytest.mark.parametrize("max_length", [None, 4, 5, 7, 12, 64])
def test_encode_pair_matches_roberta_tokenizer_fast(bpe, hf_tok, max_length):
  kw = dict(truncation="longest_first" if max_length else False,
            max_length=max_length, return_token_type_ids=True)
  for a, b in PAIRS:
    ours = bpe.encode_pair(a, b, max_length=max_length)
    theirs = hf_tok(a, b, **kw)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
      assert ours[key] == theirs[key], (a, b, max_length, key)
  ids = bpe.encode_pair("a", "b")["input_ids"]
  assert ids == [0] + bpe.encode("a") + [2, 2] + bpe.encode("b") + [2]
  with pytest.raises(ValueError, match="max_length"):
    bpe.encode_pair("a", "b", max_length=3)


def _check_offsets(tok, text, ids, offsets):
  """Each piece's range holds its bytes; every non-space char is covered."""
  starts = [s for s, _ in offsets]
  ends = [e for _, e in offsets]
  assert starts == sorted(starts) and ends == sorted(ends)
  covered = set()
  for i, (s, e) in zip(ids, offsets):
    assert 0 <= s <= e <= len(text)
    covered.update(range(s, e))
    if i in (tok.mask_id, tok.cls_id, tok.sep_id, tok.pad_id, tok.unk_id):
      assert text[s:e] == tok.id_to_piece(i)
      continue
    surface = bytes(SYMBOL_TO_BYTE[c] for c in tok.id_to_piece(i))
    # The piece's leading space is trimmed off its range; a piece of part of
    # a character covers the whole character.
    assert surface.lstrip(b" ") in text[s:e].encode("utf-8"), (text, i)
  assert {i for i, c in enumerate(text) if not c.isspace()} <= covered


def test_offsets_map_back_to_the_text(bpe, hf_tok, heldout):
  for text in TRICKY + heldout[::10]:
    ids, offsets = bpe.encode_with_offsets(text)
    assert ids == bpe.encode(text)
    want = hf_tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert offsets == [tuple(o) for o in want["offset_mapping"]], text
    _check_offsets(bpe, text, ids, offsets)
  # ASCII: the ranges tile the text but for the spaces pieces start with.
  text = "say hello, Ishmael  again"
  _, offsets = bpe.encode_with_offsets(text)
  assert "".join(text[s:e] for s, e in offsets) == "sayhello,Ishmaelagain"


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_arbitrary_unicode_matches_hf_and_round_trips(bpe, hf_tok, text):
  ids, offsets = bpe.encode_with_offsets(text)
  assert ids == hf_tok(text, add_special_tokens=False)["input_ids"]
  assert all(0 <= i < VOCAB for i in ids)
  _check_offsets(bpe, text, ids, offsets)
  # Byte-level BPE is lossless where no special token's text occurs.
  assume(not any(s in text for s in SPECIALS))
  assert bpe.decode(ids) == text


def test_word_starts_and_whole_word_masking(bpe):
  pieces = [bpe.id_to_piece(i) for i in range(VOCAB)]
  flags = bpe.is_word_start(np.arange(VOCAB))
  assert flags.dtype == bool
  assert flags[:5].all()  # specials
  np.testing.assert_array_equal(flags[5:],
                                [p.startswith("\u0120") for p in pieces[5:]])
  vocab = loader_lib.Vocabulary.from_tokenizer(bpe)
  assert (vocab.mask_id, vocab.pad_id) == (4, 1)
  np.testing.assert_array_equal(np.flatnonzero(vocab.special), [0, 1, 2, 4])
  # Whole-word masking, if asked, masks all of a word's pieces or none.
  ids = [0] + bpe.encode("The unbelievably quarrelsome whalers disembarked "
                         "tremendously") + [2]
  starts = bpe.is_word_start(ids)
  starts[1] = True  # the first word follows <s>, so it starts a word
  word = np.cumsum(starts)
  batch = np.asarray([ids] * 16)
  out = masking.mask_batch(
      batch, np.ones_like(batch), row_keys(0, 0, np.arange(16)),
      word_start=vocab.word_start, special=vocab.special,
      mask_id=vocab.mask_id, vocab_size=VOCAB,
      config=masking.MaskingConfig(max_predictions=6, masked_lm_prob=0.3,
                                   max_ngram=1))
  assert len(ids) - 2 > int(starts[1:-1].sum())  # some words have 2+ pieces
  for positions, weights in zip(out["masked_positions"],
                                out["masked_weights"]):
    chosen = set(positions[weights > 0].tolist())
    for w in {word[p] for p in chosen}:
      assert set(np.flatnonzero(word == w)) <= chosen


def test_save_and_load_through_transformers(bpe, hf_tok, tmp_path):
  out = tmp_path / "saved"
  path = bpe.save(out)
  assert os.path.basename(path) == "tokenizer.json"
  assert {"tokenizer.json", "vocab.json", "merges.txt",
          "tokenizer_config.json"} <= set(os.listdir(out))
  auto = transformers.AutoTokenizer.from_pretrained(str(out))
  assert type(auto).__name__ == "RobertaTokenizer"
  assert (auto.cls_token_id, auto.pad_token_id, auto.sep_token_id,
          auto.mask_token_id) == (0, 1, 2, 4)
  from_json = Tokenizer.from_file(out)
  from_pair = Tokenizer.from_file(out / "vocab.json")
  assert from_json.path == str(out / "tokenizer.json") and from_json.is_bpe
  assert from_pair.is_bpe
  for text in TRICKY:
    want = bpe.encode(text)
    assert auto(text, add_special_tokens=False)["input_ids"] == want, text
    assert from_json.encode(text) == from_pair.encode(text) == want, text
  # transformers' own save (tokenizer.json only) is recognised as BPE too.
  hf_tok.save_pretrained(tmp_path / "hf")
  again = Tokenizer.find_in(tmp_path / "hf")
  text = "The <mask> sat."
  assert again.is_bpe and again.encode(text) == bpe.encode(text)
  # A lone vocab.json is not a tokenizer, and a WordPiece tokenizer.json
  # stays WordPiece.
  lone = tmp_path / "lone"
  lone.mkdir()
  (lone / "vocab.json").write_text(json.dumps({"a": 0}), encoding="utf-8")
  assert Tokenizer.find_in(lone) is None
  with pytest.raises(FileNotFoundError, match="merges.txt"):
    Tokenizer.from_file(lone / "vocab.json")
  wp = tokenizers.Tokenizer(tokenizers.models.WordPiece(
      {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hi": 3}, unk_token="[UNK]"))
  wp.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  wp.save(str(tmp_path / "tokenizer.json"))
  word_piece = Tokenizer.from_file(tmp_path / "tokenizer.json")
  assert not word_piece.is_bpe and word_piece.cls_id == 1


def _train(corpus, out, vocab_size=400):
  return text_train.train(corpus, vocab_size, kind="bpe", output=out)


def test_training_is_deterministic(corpus, tmp_path):
  """Same corpus and size: the same files, in this process and another."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cli = subprocess.run(
      [sys.executable, "-m", "albert_jax.text.train_tokenizer", "--type", "bpe",
       "--input", corpus, "--vocab_size", "400", "--output",
       str(tmp_path / "cli")], capture_output=True, text=True, env=env,
      timeout=120, check=False)
  assert cli.returncode == 0, cli.stderr
  assert "Wrote" in cli.stdout and "mask=4" in cli.stdout, cli.stdout
  first, second = _train(corpus, tmp_path / "a"), _train(corpus, tmp_path / "b")
  for name in ("tokenizer.json", "vocab.json", "merges.txt"):
    data = [(d / name).read_bytes() for d in (tmp_path / "a", tmp_path / "b",
                                             tmp_path / "cli")]
    assert data[0] == data[1] == data[2], name
  text = "It cost 9,000 dollars in 1999."
  assert first.encode(text) == second.encode(text)
  other = _train(corpus, tmp_path / "c", vocab_size=420)
  assert other.vocab_size == 420


def test_training_refuses_bad_corpora(tmp_path, capsys, caplog):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n  \n\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"No usable sentences .*empty\.txt"):
    _train(str(empty), tmp_path / "o1")
  latin = tmp_path / "latin1.txt"
  latin.write_bytes("café crème\nthé\n".encode("latin-1"))
  with pytest.raises(ValueError,
                     match=r"latin1\.txt \(2 lines were not valid UTF-8"):
    _train(str(latin), tmp_path / "o2")
  assert "Skipped 2 line(s) that are not UTF-8" in caplog.text
  small = tmp_path / "small.txt"
  small.write_text("just a few words\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"gave only \d+ pieces"):
    _train(str(small), tmp_path / "o3")
  with pytest.raises(ValueError, match="256 byte symbols"):
    _train(str(small), tmp_path / "o4", vocab_size=100)
  with pytest.raises(FileNotFoundError, match="nothing-here"):
    _train(str(tmp_path / "nothing-here*.txt"), tmp_path / "o5")
  with pytest.raises(ValueError, match="kind 'wordpiece'"):
    text_train.train(str(small), 400, kind="wordpiece")
  with pytest.raises(SystemExit):
    text_train.main(["--type", "bpe", "--input", str(small), "--cased"])
  assert "--cased do(es) not apply to --type bpe" in capsys.readouterr().err


def test_workdir_bpe_is_trained_once_and_reused(corpus, tmp_path,
                                                monkeypatch):
  config = ml_collections.ConfigDict(dict(
      seed=0, model=dict(vocab_size=400),
      data=dict(corpus=corpus, format="sentences", tokenizer="",
                tokenizer_type="bpe")))
  run = tmp_path / "run"
  # What a run killed while training leaves behind.
  (run / "bpe.partial").mkdir(parents=True)
  (run / "bpe.partial" / "vocab.json").write_text("{", encoding="utf-8")
  (run / "bpe").mkdir()
  (run / "bpe" / "merges.txt").write_text("#version: 0.2\n",
                                          encoding="utf-8")
  tok = run_tokenizer.ensure(config.data, str(run),
                             vocab_size=config.model.vocab_size,
                             seed=config.seed)
  assert tok.is_bpe and tok.vocab_size == 400
  assert tok.path == str(run / "bpe" / "tokenizer.json")
  assert sorted(os.listdir(run)) == ["bpe"]
  assert sorted(os.listdir(run / "bpe")) == [
      "merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
  # A resumed run loads it rather than training again.
  def no_training(*args, **kwargs):
    raise AssertionError("trained again")
  monkeypatch.setattr(text_train, "train", no_training)
  monkeypatch.setattr(text_train, "train_bpe", no_training)
  again = run_tokenizer.ensure(config.data, str(run),
                               vocab_size=config.model.vocab_size,
                               seed=config.seed)
  assert again.encode("Call me Ishmael.") == tok.encode("Call me Ishmael.")
  config.data.tokenizer_type = "wordpiece"
  with pytest.raises(ValueError, match="tokenizer_type='wordpiece'"):
    run_tokenizer.ensure(config.data, str(tmp_path / "other"),
                         vocab_size=config.model.vocab_size,
                         seed=config.seed)


# --------------------------------------------------------------------------
# configs/roberta_base.py.


def _config(arg=None):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "roberta_base", CONFIGS / "roberta_base.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def _count(cfg, **kw):
  model = Albert(cfg, **kw)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))


def test_roberta_base_is_hf_roberta_base():
  c = _config()
  cfg = ModelConfig.from_dict(c.model)
  hf_config = transformers.RobertaConfig(
      **hf_config_lib.config_to_hf(cfg, "roberta", "RobertaForMaskedLM"))
  for key, value in dict(vocab_size=50265, hidden_size=768,
                         num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, hidden_act="gelu",
                         max_position_embeddings=514, type_vocab_size=1,
                         pad_token_id=1, layer_norm_eps=1e-5,
                         hidden_dropout_prob=0.1).items():
    assert getattr(hf_config, key) == value, key
  with torch.device("meta"):
    mlm = transformers.RobertaForMaskedLM(hf_config)
    bare = transformers.RobertaModel(hf_config)
  hf_mlm = sum(p.numel() for p in mlm.parameters())
  assert hf_mlm == 124_697_433  # roberta-base's RobertaForMaskedLM
  assert _count(cfg, heads=("mlm",), pooler=False) == hf_mlm
  encoder = _count(cfg, heads=())  # with the pooler, as in the README
  assert encoder == sum(p.numel() for p in bare.parameters()) == 124_645_632
  assert _count(cfg, heads=("mlm",)) - encoder == 642_393
  assert cfg.max_length == 512 and cfg.mlm_activation == "gelu"
  # The paper's recipe.
  assert (c.data.objective, c.data.tokenizer_type, c.data.dynamic_masking,
          c.pretraining) == ("none", "bpe", True, "masked_lm")
  assert (c.masking.whole_word, c.masking.max_ngram, c.masking.masked_lm_prob,
          c.masking.max_predictions) == (False, 1, 0.15, 80)
  o = c.optimizer
  assert (o.name, o.learning_rate, o.b1, o.b2, o.eps, o.weight_decay,
          o.bias_correction, o.clip_norm, o.warmup_steps) == (
              "adamw", 6e-4, 0.9, 0.98, 1e-6, 0.01, True, 0.0, 24000)
  assert (c.num_train_steps, c.batch_size, c.data.max_seq_length) == (
      500_000, 8192, 512)
  tiny = _config("size=tiny")
  assert (tiny.model.vocab_size, tiny.data.max_seq_length,
          tiny.model.max_position_embeddings, tiny.masking.max_predictions,
          tiny.data.tokenizer_type) == (VOCAB, 128, 130, 24, "bpe")
  with pytest.raises(ValueError, match="choose one of"):
    _config("size=large")


# --------------------------------------------------------------------------
# The tiny config, end to end.

SEQ = 64
TINY_RUN = [
    "--config=configs/roberta_base.py:size=tiny",
    "--config.fast_compile=True",
    "--config.num_train_steps=4",
    "--config.batch_size=8",
    f"--config.data.max_seq_length={SEQ}",
    f"--config.model.max_position_embeddings={SEQ + 2}",
    "--config.masking.max_predictions=16",
    "--config.optimizer.warmup_steps=1",
    "--config.log_every_steps=2",
    "--config.checkpoint_every_steps=4",
    "--config.eval_batches=0",
    "--config.data.eval_fraction=0.0",
]


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("roberta_run"))
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
      [sys.executable, "-m", "albert_jax.main", *TINY_RUN,
       f"--config.data.corpus={corpus}", f"--workdir={workdir}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


@pytest.mark.long
def test_run_trains_a_bpe_in_the_workdir(run):
  assert os.path.exists(os.path.join(run, "bpe", "tokenizer.json"))
  assert not os.path.exists(os.path.join(run, "spm"))
  final = json.load(open(os.path.join(run, "final_metrics.json")))
  assert final["step"] == 4
  config = json.load(open(os.path.join(run, "config.json")))
  assert config["data"]["tokenizer_type"] == "bpe"
  meta = loader_lib.read_metadata(os.path.join(run, "data"))
  assert meta["tokenizer"] == os.path.join(run, "bpe", "tokenizer.json")
  assert meta["objective"] == "none" and meta["vocab_size"] == VOCAB


def _instances(data_dir):
  meta = loader_lib.read_metadata(data_dir)
  out = []
  for path in loader_lib.record_files(data_dir, meta, "train"):
    reader = array_record_module.ArrayRecordReader(path)
    try:
      out += [instances_lib.from_bytes(r) for r in reader.read_all()]
    finally:
      reader.close()
  return out


@pytest.mark.long
def test_run_data_are_full_sentences_across_documents(run, corpus):
  tok = Tokenizer.from_file(os.path.join(run, "bpe"))
  documents, doc = [], []
  with gzip.open(corpus, "rt", encoding="utf-8") as f:
    for line in list(f) + [""]:
      if line.strip():
        doc.append(line.strip())
      elif doc:
        documents.append([i for s in doc for i in tok.encode(s)])
        doc = []
  def joined(ids):  # commas on both ends: matches fall on token bounds
    return "," + ",".join(map(str, ids)) + ","

  streams = [joined(d) for d in documents]
  crossings = packed = 0
  for inst in _instances(os.path.join(run, "data")):
    tokens = inst.tokens.tolist()
    assert inst.label == -1 and not inst.token_type_ids.any()
    assert tokens[0] == 0 and tokens[-1] == 2 and len(tokens) <= SEQ
    body = tokens[1:-1]
    cuts = [i for i, t in enumerate(body) if t == 2]
    crossings += len(cuts)
    packed += len(body) - len(cuts)
    # Around each inner </s>: the end of one document, the start of another.
    for k, cut in enumerate(cuts):
      before = body[(cuts[k - 1] + 1 if k else 0):cut]
      after = body[cut + 1:(cuts[k + 1] if k + 1 < len(cuts) else None)]
      assert any(s.endswith(joined(before)) for s in streams)
      assert any(s.startswith(joined(after)) for s in streams)
  # A document runs on into the next unless the next one's first sentence
  # does not fit (20 of the 44 boundaries here).
  assert crossings >= 10
  # Each token of the corpus is in exactly one instance.
  assert packed == sum(map(len, documents))


@pytest.mark.long
def test_run_masks_change_between_epochs(run):
  config = json.load(open(os.path.join(run, "config.json")))
  assert config["data"]["dynamic_masking"] is True
  tok = Tokenizer.from_file(os.path.join(run, "bpe"))
  vocab = loader_lib.Vocabulary.from_tokenizer(tok)
  data_dir = os.path.join(run, "data")
  n = int(loader_lib.read_metadata(data_dir)["splits"]["train"]["instances"])
  recorded = ml_collections.ConfigDict(config)

  def masks(dynamic):
    """{record: masked positions} for epochs 0 and 1 (one step = an epoch)."""
    recorded.data.dynamic_masking = dynamic
    loader = pipeline.make_loader(recorded.data, recorded.masking, data_dir,
                                  "train", vocab, None, global_batch_size=n,
                                  seed=recorded.seed)
    epochs = []
    for step in (0, 1):
      records, _ = loader.record_indices(step)
      batch = loader.local_batch(step)
      epochs.append({int(r): tuple(p[w > 0]) for r, p, w in zip(
          records, batch["masked_positions"], batch["masked_weights"])})
    return epochs

  first, second = masks(True)
  assert set(first) == set(second) == set(range(n))
  changed = sum(first[r] != second[r] for r in range(n))
  assert changed >= 0.9 * n
  first, second = masks(False)
  assert first == second


@pytest.mark.long
def test_run_exports_to_hf_roberta(run, tmp_path):
  pt = albert_jax.load_pretrained(run)
  assert pt.tokenizer is not None and pt.tokenizer.is_bpe
  assert pt.tokenizer.path == os.path.join(run, "bpe", "tokenizer.json")
  out = str(tmp_path / "hf")
  pt.to_hf(out)
  model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
  assert type(model).__name__ == "RobertaForMaskedLM"
  auto = transformers.AutoTokenizer.from_pretrained(out)
  texts = ["Call me Ishmael.", " The <mask> of the Union is strong.",
           "def f(x): return x ** 2  # café 😀"]
  rows = []
  for text in texts:
    ids = auto(text)["input_ids"]
    assert ids == [0] + pt.tokenizer.encode(text) + [2]
    rows.append(ids)
  length = max(map(len, rows))
  ids = np.full((len(rows), length), pt.tokenizer.pad_id, np.int64)
  mask = np.zeros_like(ids)
  for i, row in enumerate(rows):
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
  ours = np.asarray(pt(ids, None, mask)["mlm_logits"])
  with torch.no_grad():
    theirs = model(input_ids=torch.as_tensor(ids),
                   attention_mask=torch.as_tensor(mask)).logits.numpy()
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], rtol=0, atol=1e-5)
