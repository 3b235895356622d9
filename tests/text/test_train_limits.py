"""SentencePiece training at its limits: long lines and too many pieces."""

import random

import pytest

from albert_jax.text import train
from albert_jax.text.tokenizer import Tokenizer


def _paragraph_corpus(path, lines=120, words=1200):
  """One paragraph per line, about 6 KB each (SentencePiece's own limit is
  4192 bytes), of 300 distinct words."""
  r = random.Random(0)
  vocab = [f"w{i}" for i in range(300)]
  path.write_text("".join(" ".join(r.choices(vocab, k=words)) + ".\n\n"
                          for _ in range(lines)), encoding="utf-8")
  return str(path)


def test_a_paragraph_per_line_corpus_trains_on_every_line(tmp_path):
  corpus = _paragraph_corpus(tmp_path / "c.txt")
  model, stats = train.train_sentencepiece(
      corpus, 100, output=tmp_path / "s.model", num_threads=1)
  # Every line is over SentencePiece's 4192-byte limit, which used to drop
  # them all and fail with its raw "[!sentences_.empty()]".
  assert stats["sampled"] == 120
  assert Tokenizer.from_file(model).vocab_size == 100


def test_too_many_pieces_names_the_setting_and_the_limit(tmp_path):
  corpus = _paragraph_corpus(tmp_path / "c.txt", lines=20)
  with pytest.raises(ValueError) as e:
    train.train_sentencepiece(corpus, 5000, output=tmp_path / "s.model",
                              num_threads=1)
  message = str(e.value)
  assert message.startswith("A vocabulary of 5000 pieces is more than this "
                            "corpus supports (at most ")
  assert message.endswith(
      "); lower it (config.model.vocab_size when a run trains its own "
      "tokenizer, --vocab_size for albert_jax.text.train) or train on more "
      "text.")


def test_a_megabyte_sentence_is_left_out_with_a_warning(tmp_path, caplog):
  """Paragraphs are trained on; a sentence over the cap (here 100 KB) is
  not (it would make training take minutes), and the log says so."""
  corpus = _paragraph_corpus(tmp_path / "c.txt")
  with open(corpus, "a", encoding="utf-8") as f:
    f.write("w1 " * 34_000 + ".\n\n")
  with caplog.at_level("WARNING", logger="albert_jax.text.train"):
    _, stats = train.train_sentencepiece(
        corpus, 100, output=tmp_path / "s.model", num_threads=1)
  assert stats["sampled"] == 121
  assert ("1 of 121 sentences are over 65536 bytes and are left out of the "
          "vocabulary's training (they are still tokenised).") in caplog.text
