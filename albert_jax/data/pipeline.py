"""The trainer's data setup: tokenizer and prepared instances, built once.

With `config.data.tokenizer` and `config.data.data_dir` empty, the first run
trains a tokenizer (`config.data.tokenizer_type`: a SentencePiece model in
WORKDIR/spm, or a byte-level BPE in WORKDIR/bpe) and prepares the corpus
inside the workdir, and later runs (resumes) reuse both; a prepared dataset
whose recipe no longer matches the config is rebuilt rather than silently
reused.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil

from albert_jax.data import loader as loader_lib
from albert_jax.data import masking as masking_lib
from albert_jax.data import prepare as prepare_lib

log = logging.getLogger(__name__)

BUNDLED_DIR = os.path.join(os.path.dirname(__file__), "bundled", "corpus")
# The settings a data error may ask the trainer's user to change.
TRAINER_OPTIONS = {"input": "config.data.corpus",
                   "format": "config.data.format",
                   "objective": "--config.data.objective",
                   "eval_fraction": "config.data.eval_fraction"}


def corpus_pattern(corpus: str) -> str:
  """"bundled" → the shipped corpus; anything else is a glob or TFDS spec."""
  if corpus == "bundled":
    return os.path.join(BUNDLED_DIR, "*.txt.gz")
  return corpus


def _load_tokenizer(path: str, what: str, fix: str):
  """Tokenizer.from_file with errors that say which setting and how to fix.

  SentencePiece reports a missing or unparsable file as a bare RuntimeError.
  """
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    raise FileNotFoundError(f"{what} {path!r} does not exist; {fix}")
  try:
    return Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"{what} {path!r} cannot be read as a tokenizer ({type(e).__name__}: "
        f"{e}); it is damaged or not a SentencePiece .model, vocab.txt, "
        f"tokenizer.json or vocab.json. {fix[0].upper() + fix[1:]}") from e


# config.data.tokenizer_type → what a workdir's own tokenizer is: its
# directory and the file whose presence means it is complete.
TOKENIZER_TYPES = {"sentencepiece": ("spm", "spiece.model"),
                   "bpe": ("bpe", "tokenizer.json")}


def tokenizer_type(config) -> str:
  """`config.data.tokenizer_type`, checked; configs (and recorded runs)
  from before the field existed train SentencePiece."""
  data = (config["data"] if "data" in config else None) or {}
  kind = data.get("tokenizer_type") or "sentencepiece"
  if kind not in TOKENIZER_TYPES:
    raise ValueError(
        f"config.data.tokenizer_type={kind!r}; choose one of "
        f"{sorted(TOKENIZER_TYPES)} (sentencepiece: ALBERT's unigram model; "
        "bpe: RoBERTa's byte-level BPE).")
  return kind


def workdir_tokenizer_path(config, workdir: str) -> str:
  """Where the trainer keeps the tokenizer it trains in `workdir`."""
  directory, name = TOKENIZER_TYPES[tokenizer_type(config)]
  return os.path.join(workdir, directory, name)


def _train_tokenizer(config, path: str):
  """Trains the workdir's tokenizer, atomically.

  The vocabulary is trained under a temporary name and renamed into place,
  so a run killed while training leaves no truncated `spiece.model` (or half
  a BPE directory) that every later run would fail to load; the rerun
  trains again.
  """
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  corpus = config.data.corpus
  kind = tokenizer_type(config)
  if config.data.format != "sentences":
    raise ValueError(
        "Training a tokenizer needs a corpus in the official sentence "
        "format; for other formats give config.data.tokenizer.")
  try:
    files = prepare_lib.documents_lib.expand_paths(corpus_pattern(corpus))
  except FileNotFoundError as e:
    raise FileNotFoundError(
        f"config.data.corpus={corpus!r}: {e} Give files or globs of text "
        "(comma-separated), or 'bundled' for the shipped corpus.") from e
  what = "byte-level BPE" if kind == "bpe" else "SentencePiece model"
  log.info("Training a %d-piece %s on %d file(s) → %s",
           config.model.vocab_size, what, len(files), path)
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
  try:
    Tokenizer.train(files, config.model.vocab_size, kind=kind, output=output,
                    seed=config.seed, input_sentence_size=2_000_000)
  except ValueError as e:  # nothing usable in the corpus
    raise ValueError(
        f"Cannot train a tokenizer on config.data.corpus={corpus!r}: {e} "
        "Point config.data.corpus at UTF-8 text in the official format (a "
        "sentence per line, a blank line between documents), or give a "
        "trained one as config.data.tokenizer.") from e
  if kind == "bpe":
    os.replace(partial, final)  # the directory appears whole
    return Tokenizer.from_file(path)
  # The .model goes last: its presence means the tokenizer is complete.
  if os.path.exists(partial + ".vocab"):
    os.replace(partial + ".vocab", path[:-len(".model")] + ".vocab")
  os.replace(partial + ".model", path)
  return Tokenizer.from_file(path)


def ensure_tokenizer(config, workdir: str):
  """The configured tokenizer, or one trained into the workdir on first use
  (WORKDIR/spm/spiece.model, or WORKDIR/bpe/ for tokenizer_type "bpe").

  Raises:
    FileNotFoundError: config.data.tokenizer or the corpus does not exist.
    ValueError: the tokenizer file is damaged, the corpus has no usable
      text, or the vocabulary size disagrees with model.vocab_size.
  """
  if config.data.tokenizer:
    tok = _load_tokenizer(
        config.data.tokenizer, "config.data.tokenizer",
        "give the path of a SentencePiece .model (or vocab.txt / "
        "tokenizer.json / vocab.json / an HF directory), or leave "
        "config.data.tokenizer empty to train one in the workdir.")
  else:
    path = workdir_tokenizer_path(config, workdir)
    if os.path.exists(path):
      tok = _load_tokenizer(
          path, "The workdir's tokenizer",
          "delete it (and the workdir's data/) to train a new one, or start "
          "in a new workdir.")
    else:
      tok = _train_tokenizer(config, path)
  if tok.vocab_size != config.model.vocab_size:
    raise ValueError(
        f"The tokenizer has {tok.vocab_size} pieces but model.vocab_size is "
        f"{config.model.vocab_size}; set --config.model.vocab_size="
        f"{tok.vocab_size}.")
  return tok


def _prepare_config(config, tokenizer_path: str, output_dir: str):
  d = config.data
  return prepare_lib.PrepareConfig(
      tokenizer=tokenizer_path, output_dir=output_dir,
      max_seq_length=d.max_seq_length, objective=d.objective,
      nsp_negatives_in_sop=d.nsp_negatives_in_sop,
      short_seq_prob=d.short_seq_prob, dupe_factor=d.dupe_factor,
      # .get: configs written before the field existed (a resumed run's
      # config.json, a hand-built data section) cut at sentence ends.
      exact_length=d.get("exact_length", False), seed=config.seed, eval_fraction=d.eval_fraction,
      num_workers=d.num_workers)


def _recipe_matches(metadata: dict, wanted: prepare_lib.PrepareConfig) -> bool:
  have = metadata.get("config", {})
  keys = ("max_seq_length", "objective", "nsp_negatives_in_sop",
          "short_seq_prob", "dupe_factor", "exact_length", "seed",
          "eval_fraction")
  # Data prepared before a field existed was prepared with its default.
  defaults = {f.name: f.default
              for f in dataclasses.fields(prepare_lib.PrepareConfig)}
  return all(have.get(k, defaults[k]) == getattr(wanted, k) for k in keys)


def ensure_dataset(config, workdir: str, tokenizer) -> str:
  """The prepared data directory: configured, or built in WORKDIR/data."""
  if config.data.data_dir:
    meta = loader_lib.read_metadata(config.data.data_dir)
    if int(meta["max_seq_length"]) != config.data.max_seq_length:
      raise ValueError(
          f"{config.data.data_dir} holds instances of length "
          f"{meta['max_seq_length']} but config.data.max_seq_length is "
          f"{config.data.max_seq_length}.")
    return config.data.data_dir
  import jax  # pylint: disable=g-import-not-at-top
  out = os.path.join(workdir, "data")
  wanted = _prepare_config(config, tokenizer.path, out)
  path = os.path.join(out, loader_lib.METADATA)
  if os.path.exists(path) and _recipe_matches(
      loader_lib.read_metadata(out), wanted):
    return out
  if jax.process_count() > 1:
    raise ValueError(
        "Multi-host runs read prepared data; run `python -m "
        "albert_jax.data.prepare` once and set config.data.data_dir.")
  log.info("Preparing %s → %s", config.data.corpus, out)
  stats = prepare_lib.documents_lib.ReadStats()
  docs = prepare_lib.open_documents(corpus_pattern(config.data.corpus),
                                    config.data.format, stats)
  metadata = prepare_lib.prepare(
      docs, wanted, stats, source=f"config.data.corpus={config.data.corpus!r}",
      options=TRAINER_OPTIONS)
  log.info("Prepared data:\n%s", prepare_lib.summary(metadata))
  return out


def masking_config(config) -> masking_lib.MaskingConfig:
  m = config.masking
  return masking_lib.MaskingConfig(
      max_predictions=m.max_predictions, masked_lm_prob=m.masked_lm_prob,
      max_ngram=m.max_ngram, favor_shorter_ngram=m.favor_shorter_ngram,
      whole_word=m.whole_word,
      # Configs recorded before these fields existed used BERT's 80/10/10.
      mask_token_prob=m.get("mask_token_prob", 0.8),
      random_token_prob=m.get("random_token_prob", 0.1))


def make_loader(config, data_dir: str, split: str, vocab, sharding,
                global_batch_size: int | None = None, seed: int | None = None,
                masked: bool = True):
  """The config's loader; `masked=False` for objectives that read the
  unmasked token stream (causal LM)."""
  return loader_lib.Loader(
      data_dir, split, global_batch_size=global_batch_size or config.batch_size,
      vocab=vocab, seed=config.seed if seed is None else seed,
      masking_config=masking_config(config) if masked else None,
      dynamic_masking=config.data.dynamic_masking, sharding=sharding,
      prefetch=config.data.prefetch)


def has_split(data_dir: str, split: str) -> bool:
  meta = loader_lib.read_metadata(data_dir)
  return bool(meta.get("splits", {}).get(split, {}).get("instances", 0))
