"""The run's tokenizer: the configured one, or one trained into the workdir.

Every entry point that needs "the tokenizer of this run" (the trainer, the
fine-tuner, `load_pretrained` on a workdir) comes here, so the lookup order
and the error messages are written once:

  1. `config.data.tokenizer`, when set;
  2. else the workdir's own: WORKDIR/spm/spiece.model, or WORKDIR/bpe/
     for `config.data.tokenizer_type="bpe"`;
  3. else (trainer only) one is trained there, atomically.

Every path is local or `gs://` (`albert_jax.storage`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
from typing import Any, Mapping

from albert_jax import storage
from albert_jax.text import documents as documents_lib
from albert_jax.text import tokenizer as tokenizer_lib
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# config.data.tokenizer_type → what a workdir's own tokenizer is: its
# directory and the file whose presence means it is complete.
TOKENIZER_TYPES = {"sentencepiece": ("spm", "spiece.model"),
                   "bpe": ("bpe", "tokenizer.json")}
CONFIGURED_FIX = (
    "give the path of a SentencePiece .model (or vocab.txt / tokenizer.json "
    "/ vocab.json / an HF directory), or leave config.data.tokenizer empty "
    "to train one in the workdir.")


def load(path: str, what: str, fix: str) -> Tokenizer:
  """`Tokenizer.from_file` with errors that say which setting and how to fix.

  SentencePiece reports a missing or unparsable file as a bare RuntimeError.

  Args:
    path: the tokenizer file or directory, local or `gs://`.
    what: how the error names it ("config.data.tokenizer").
    fix: the fix, a sentence starting lower-case.
  """
  if not storage.path(path).exists():
    raise FileNotFoundError(f"{what} {path!r} does not exist; {fix}")
  try:
    return Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"{what} {path!r} cannot be read as a tokenizer ({type(e).__name__}: "
        f"{e}); it is damaged or not a SentencePiece .model, vocab.txt, "
        f"tokenizer.json or vocab.json. {fix[0].upper() + fix[1:]}") from e


def tokenizer_type(data: Mapping[str, Any]) -> str:
  """`config.data.tokenizer_type` of a run's `data` section, checked;
  configs (and recorded runs) from before the field existed, and
  fine-tuning configs, which have none, train SentencePiece."""
  kind = data.get("tokenizer_type") or "sentencepiece"
  if kind not in TOKENIZER_TYPES:
    raise ValueError(
        f"config.data.tokenizer_type={kind!r}; choose one of "
        f"{sorted(TOKENIZER_TYPES)} (sentencepiece: ALBERT's unigram model; "
        "bpe: RoBERTa's byte-level BPE).")
  return kind


def workdir_path(data: Mapping[str, Any], workdir: str) -> str:
  """Where the trainer keeps the tokenizer it trains in `workdir`, by the
  run's `config.data` section."""
  directory, name = TOKENIZER_TYPES[tokenizer_type(data)]
  return os.fspath(storage.path(workdir) / directory / name)


def recorded_path(recorded: str, workdir: str, field: str) -> str:
  """A path recorded in `workdir`'s config.json, as a reader may follow it:
  a gs:// URL or an absolute path as the user gave it to the run; a
  relative one inside the workdir (a reader's working directory is not the
  run's), where it must stay.

  Raises:
    ValueError: a relative path that leads outside the workdir (`..`, or a
      symlink inside it that points out), naming it and the fix.
  """
  if storage.is_remote(recorded) or os.path.isabs(
      os.path.expanduser(recorded)):
    return recorded
  root = os.fspath(storage.path(workdir))
  if storage.is_remote(root):
    inside = posixpath.normpath(posixpath.join(root[len("gs://"):],
                                               recorded))
    bucket_root = root[len("gs://"):].rstrip("/")
    ok = inside.startswith(bucket_root + "/")
    resolved = "gs://" + inside
  else:
    real = os.path.realpath(root)
    resolved = os.path.realpath(os.path.join(root, recorded))
    ok = resolved.startswith(real.rstrip(os.sep) + os.sep)
  if not ok:
    raise ValueError(
        f"{workdir}/config.json records {field}={recorded!r}, a relative "
        "path that leads outside the workdir; albert_jax does not follow "
        "it. Give the file yourself (e.g. .tokenizer = "
        "Tokenizer.from_file(PATH)), or record an absolute path or gs:// "
        "URL in config.json.")
  return resolved


def find(config: Mapping[str, Any], workdir: str) -> Tokenizer | None:
  """The tokenizer a finished run trained with, or None if it has none.

  For readers of a workdir (`load_pretrained`): `config` is the run's
  recorded config.json, a plain dict.
  """
  data = config.get("data") or {}
  configured = str(data.get("tokenizer") or "")
  if configured:
    configured = recorded_path(configured, workdir, "data.tokenizer")
  own = workdir_path(data, workdir)
  # The trainer's order: a configured tokenizer wins over the workdir's.
  for candidate in (configured, own) if configured else (own,):
    if candidate and storage.path(candidate).exists():
      return load(candidate, "The run's tokenizer",
                  "set .tokenizer yourself with Tokenizer.from_file(...).")
  log.warning("No tokenizer found for %s (looked for %s); .tokenizer is None.",
              workdir, " and ".join(c for c in (configured, own) if c))
  return None


def ensure(data, workdir: str, *, vocab_size: int, seed: int) -> Tokenizer:
  """The configured tokenizer, or one trained into the workdir on first use.

  Args:
    data: the run's `config.data` section: tokenizer (a path; empty: the
      workdir's own), else tokenizer_type, corpus and format, which the
      workdir's is trained by.
    workdir: the run's workdir (local or gs://).
    vocab_size: `config.model.vocab_size`, which the tokenizer must have.
    seed: `config.seed`, a trained tokenizer's.

  Raises:
    FileNotFoundError: config.data.tokenizer or the corpus does not exist.
    ValueError: the tokenizer file is damaged, the corpus has no usable
      text, or the vocabulary size disagrees with model.vocab_size.
  """
  if data.tokenizer:
    tok = load(data.tokenizer, "config.data.tokenizer", CONFIGURED_FIX)
  else:
    path = workdir_path(data, workdir)
    if storage.path(path).exists():
      tok = load(path, "The workdir's tokenizer",
                 "delete it (and the workdir's data/) to train a new one, or "
                 "start in a new workdir.")
    else:
      tok = _train(data, path, vocab_size=vocab_size, seed=seed)
  problem = tokenizer_lib.misfit(tok, vocab_size, exact=True)
  if problem:
    raise ValueError(f"The tokenizer {problem} (model.vocab_size); set "
                     f"--config.model.vocab_size={tok.vocab_size}.")
  return tok


def _train(data, path: str, *, vocab_size: int, seed: int) -> Tokenizer:
  """Trains the workdir's tokenizer, atomically.

  The vocabulary is trained under a temporary name and renamed into place,
  so a run killed while training leaves no truncated `spiece.model` (or half
  a BPE directory) that every later run would fail to load; the rerun
  trains again. Cloud Storage has no rename: there every object is written
  whole and the file that marks the tokenizer complete goes last
  (`text_train`), which leaves the same choice of whole or absent.

  Reads `data` (a run's `config.data` section): corpus, format,
  tokenizer_type.
  """
  corpus = data.corpus
  kind = tokenizer_type(data)
  if data.format != "sentences":
    raise ValueError(
        "Training a tokenizer needs a corpus in the official sentence "
        "format; for other formats give config.data.tokenizer.")
  try:
    files = documents_lib.expand_paths(documents_lib.corpus_pattern(corpus))
  except FileNotFoundError as e:
    raise FileNotFoundError(
        f"config.data.corpus={corpus!r}: {e} Give files or globs of text "
        "(comma-separated), or 'bundled' for the shipped corpus.") from e
  what = "byte-level BPE" if kind == "bpe" else "SentencePiece model"
  log.info("Training a %d-piece %s on %d file(s) → %s",
           vocab_size, what, len(files), path)
  if storage.is_remote(path):
    output = os.fspath(storage.path(path).parent) if kind == "bpe" else path
    return _train_to(corpus, files, kind, output, vocab_size=vocab_size,
                     seed=seed)
  if kind == "bpe":
    final = os.path.dirname(path)
    partial = final + ".partial"
    for stale in (partial, final):  # left by a run killed while training
      if os.path.exists(stale):
        shutil.rmtree(stale)
    output = partial
  else:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path[:-len(".model")] + ".partial"
    output = partial + ".model"
  _train_to(corpus, files, kind, output, vocab_size=vocab_size, seed=seed)
  if kind == "bpe":
    os.replace(partial, final)  # the directory appears whole
    return Tokenizer.from_file(path)
  # The .model goes last: its presence means the tokenizer is complete.
  if os.path.exists(partial + ".vocab"):
    os.replace(partial + ".vocab", path[:-len(".model")] + ".vocab")
  os.replace(partial + ".model", path)
  return Tokenizer.from_file(path)


def _train_to(corpus: str, files: list[str], kind: str, output: str, *,
              vocab_size: int, seed: int) -> Tokenizer:
  """`text_train.train` into `output`, its corpus errors naming the
  setting to change (`config.data.corpus`, the `corpus` the `files` were
  expanded from)."""
  try:
    return text_train.train(files, vocab_size, kind=kind,
                            output=output, seed=seed,
                            input_sentence_size=2_000_000)
  except ValueError as e:  # nothing usable in the corpus
    raise ValueError(
        f"Cannot train a tokenizer on config.data.corpus={corpus!r}: {e} "
        "Point config.data.corpus at UTF-8 text in the official format (a "
        "sentence per line, a blank line between documents), or give a "
        "trained one as config.data.tokenizer.") from e
