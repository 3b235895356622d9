"""Tokenizer training at its limits: long lines, too many pieces, a full
disk."""

import os
import random
import resource
import subprocess
import sys

import pytest

from albert_jax.text import train_tokenizer
from albert_jax.text.tokenizer import Tokenizer
from locations import CORPUS
from locations import REPO


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
  model, stats = train_tokenizer.train_sentencepiece(
      corpus, 100, output=tmp_path / "s.model", num_threads=1)
  # Every line is over SentencePiece's 4192-byte limit, which used to drop
  # them all and fail with its raw "[!sentences_.empty()]".
  assert stats["sampled"] == 120
  assert Tokenizer.from_file(model).vocab_size == 100


def test_too_many_pieces_names_the_setting_and_the_limit(tmp_path):
  corpus = _paragraph_corpus(tmp_path / "c.txt", lines=20)
  with pytest.raises(ValueError) as e:
    train_tokenizer.train_sentencepiece(corpus, 5000, output=tmp_path / "s.model",
                              num_threads=1)
  message = str(e.value)
  assert message.startswith("A vocabulary of 5000 pieces is more than this "
                            "corpus supports (at most ")
  assert message.endswith(
      "); lower it (config.model.vocab_size when a run trains its own "
      "tokenizer, --vocab_size for albert_jax.text.train_tokenizer) or train on more "
      "text.")


def test_a_megabyte_sentence_is_left_out_with_a_warning(tmp_path, caplog):
  """Paragraphs are trained on; a sentence over the cap (here 100 KB) is
  not (it would make training take minutes), and the log says so."""
  corpus = _paragraph_corpus(tmp_path / "c.txt")
  with open(corpus, "a", encoding="utf-8") as f:
    f.write("w1 " * 34_000 + ".\n\n")
  with caplog.at_level("WARNING", logger="albert_jax.text.train_tokenizer"):
    _, stats = train_tokenizer.train_sentencepiece(
        corpus, 100, output=tmp_path / "s.model", num_threads=1)
  assert stats["sampled"] == 121
  assert ("1 of 121 sentences are over 65536 bytes and are left out of the "
          "vocabulary's training (they are still tokenised).") in caplog.text


def _corpus(tmp_path):
  """2000 lines of the bundled corpus, as a plain text file."""
  import gzip  # pylint: disable=g-import-not-at-top
  import itertools  # pylint: disable=g-import-not-at-top
  corpus = tmp_path / "corpus.txt"
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    corpus.write_text("".join(itertools.islice(f, 2000)), encoding="utf-8")
  return corpus


def _train_on_a_full_disk(limit: int, *args: str):
  """`python -m albert_jax.text.train_tokenizer ARGS` under a file-size
  limit of `limit` bytes (the kernel refuses writes past it: EFBIG, as
  ENOSPC on a full disk); its one `error:` line, after checking it exited
  2 without a traceback."""
  def full_disk():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  proc = subprocess.run(
      [sys.executable, "-m", "albert_jax.text.train_tokenizer", *args],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      preexec_fn=full_disk,
      # No .pyc writes: under the limit Python's bytecode write stops short
      # without an error and would leave a truncated file.
      env={**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONDONTWRITEBYTECODE": "1"})
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  (line,) = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  return line


def test_a_bpe_tokenizer_on_a_full_disk_is_one_line_and_leaves_nothing(
    tmp_path):
  """The disk fills for real: past a file-size limit the kernel refuses
  writes (EFBIG, as ENOSPC on a full disk). The tokenizers library's own
  write and ours each fail in one line naming the folder; no file of the
  set is left."""
  corpus = _corpus(tmp_path)
  out = tmp_path / "bpe"
  for limit in (2_000, 20_000):  # vocab.json (~16 KB) fails; then later
    line = _train_on_a_full_disk(
        limit, "--type", "bpe", "--input", str(corpus), "--vocab_size",
        "1000", "--output", str(out))
    assert line.startswith(f"error: Writing the BPE tokenizer into {out} "
                           "failed ("), line
    assert line.endswith("the disk is full, or the folder is not writable. "
                         "Free space there (or choose another folder) and "
                         "run again; no partial tokenizer is left."), line
    assert not out.exists() or os.listdir(out) == [], os.listdir(out)
  done = train_tokenizer.train(str(corpus), 1000, kind="bpe", output=str(out))
  assert done.vocab_size == 1000


def test_a_sentencepiece_model_on_a_full_disk_is_one_line_and_leaves_nothing(
    tmp_path):
  """As above, for SentencePiece, which does not check its model's write:
  under a 64 KiB file-size limit it returned after writing part of the
  model, and loading it raised a `ParseFromArray` traceback. The model is
  read back after training: one line, no partial file. (The same through
  `python -m albert_jax.main`: `training/test_full_disk.py`, long tier.)"""
  corpus = _corpus(tmp_path)
  out = tmp_path / "spm" / "s.model"  # about 240 KB whole
  line = _train_on_a_full_disk(
      65536, "--input", str(corpus), "--vocab_size", "300", "--num_threads",
      "1", "--output", str(out))
  assert line == (
      f"error: Writing the SentencePiece model into {out.parent} failed "
      "(65536 bytes written, which do not parse): the disk is full, or the "
      "folder is not writable. Free space there (or choose another folder) "
      "and run again; no partial model is left."), line
  assert os.listdir(out.parent) == []
