"""`load_pretrained(path).tokenizer` is the directory's vocabulary."""

import gzip

from locations import CORPUS
import numpy as np
import pytest

import albert_jax
from albert_jax.text import train_tokenizer as text_train

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

MOBY_DICK = CORPUS.parent / "moby_dick.txt.gz"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  with gzip.open(MOBY_DICK, "rt", encoding="utf-8") as f:
    lines = [next(f) for _ in range(3000)]
  corpus = tmp_path_factory.mktemp("c") / "c.txt"
  corpus.write_text("".join(lines), encoding="utf-8")
  spm = tmp_path_factory.mktemp("spm") / "spiece.model"
  tok = text_train.train([str(corpus)], 600, output=spm, seed=1,
                         num_threads=2)
  path = tmp_path_factory.mktemp("ckpt")
  config = transformers.AlbertConfig(
      vocab_size=tok.vocab_size, embedding_size=16, hidden_size=32,
      num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
  torch.manual_seed(0)
  transformers.AlbertForPreTraining(config).eval().save_pretrained(path)
  tok.save(str(path))
  return path


def test_tokenizer_loaded_from_checkpoint(checkpoint):
  model = albert_jax.load_pretrained(str(checkpoint))
  assert model.tokenizer is not None
  hf_tok = transformers.AlbertTokenizer.from_pretrained(str(checkpoint))
  text = "Call me Ishmael. Some years ago, never mind how long precisely."
  assert model.tokenizer.encode(text) == hf_tok.encode(
      text, add_special_tokens=False)
  pair = model.tokenizer.encode_pair(text, "It is a way I have.")
  out = model(np.asarray([pair["input_ids"]]),
              np.asarray([pair["token_type_ids"]]),
              np.asarray([pair["attention_mask"]]))
  assert out["mlm_logits"].shape == (1, len(pair["input_ids"]),
                                     model.tokenizer.vocab_size)


def test_tokenizer_travels_with_to_hf(checkpoint, tmp_path):
  model = albert_jax.load_pretrained(str(checkpoint))
  model.to_hf(str(tmp_path))
  again = albert_jax.load_pretrained(str(tmp_path))
  text = "The whale, the whale!"
  assert again.tokenizer.encode(text) == model.tokenizer.encode(text)


def test_no_vocabulary_means_no_tokenizer(tmp_path):
  config = transformers.AlbertConfig(
      vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=1,
      num_attention_heads=2, intermediate_size=20)
  transformers.AlbertModel(config).save_pretrained(tmp_path)
  assert albert_jax.load_pretrained(str(tmp_path)).tokenizer is None


WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "call", "me", "ish",
         "##mael", ".", "the", "whale", "!"]


@pytest.fixture(scope="module")
def padded_bert(tmp_path_factory):
  """A BertModel directory whose tokenizer.json pads and truncates every
  text to 8 tokens, as sentence-transformers exports do (to 128)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(
      {w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
  tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  tok.add_special_tokens(WORDS[:5])
  tok.enable_padding(length=8, pad_id=0, pad_token="[PAD]")
  tok.enable_truncation(8)
  path = tmp_path_factory.mktemp("padded_bert")
  tok.save(str(path / "tokenizer.json"))
  config = transformers.BertConfig(
      vocab_size=len(WORDS), hidden_size=8, num_hidden_layers=1,
      num_attention_heads=2, intermediate_size=12)
  transformers.BertModel(config).save_pretrained(path)
  return path


def test_tokenizer_json_padding_is_switched_off(padded_bert):
  """encode gives the text's own ids, neither padded nor truncated to 8."""
  tok = albert_jax.load_pretrained(str(padded_bert)).tokenizer
  assert tok.encode("Call me Ishmael.") == [5, 6, 7, 8, 9]
  text = "The whale! " * 3
  assert tok.encode(text) == [10, 11, 12] * 3
  assert tok.encode_pair("Call me", "the whale")["input_ids"] == [
      2, 5, 6, 3, 10, 11, 3]


def test_wordpiece_tokenizer_travels_with_to_hf(padded_bert, tmp_path):
  model = albert_jax.load_pretrained(str(padded_bert))
  model.to_hf(str(tmp_path))
  again = albert_jax.load_pretrained(str(tmp_path))
  assert again.model_type == "bert"
  text = "Call me Ishmael, the whale!"
  assert again.tokenizer.encode(text) == model.tokenizer.encode(text)
  hf_tok = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
  assert again.tokenizer.encode(text) == hf_tok.encode(
      text, add_special_tokens=False)
