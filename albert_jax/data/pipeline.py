"""The trainer's data setup: tokenizer and prepared instances, built once.

With `config.data.tokenizer` and `config.data.data_dir` empty, the first run
trains a SentencePiece model and prepares the corpus inside the workdir, and
later runs (resumes) reuse both; a prepared dataset whose recipe no longer
matches the config is rebuilt rather than silently reused.
"""

from __future__ import annotations

import glob
import logging
import os

from albert_jax.data import loader as loader_lib
from albert_jax.data import masking as masking_lib
from albert_jax.data import prepare as prepare_lib

log = logging.getLogger(__name__)

BUNDLED_DIR = os.path.join(os.path.dirname(__file__), "bundled", "corpus")


def corpus_pattern(corpus: str) -> str:
  """"bundled" → the shipped corpus; anything else is a glob or TFDS spec."""
  if corpus == "bundled":
    return os.path.join(BUNDLED_DIR, "*.txt.gz")
  return corpus


def ensure_tokenizer(config, workdir: str):
  """The configured tokenizer, or one trained into WORKDIR/spm on first use."""
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  if config.data.tokenizer:
    tok = Tokenizer.from_file(config.data.tokenizer)
  else:
    path = os.path.join(workdir, "spm", "spiece.model")
    if os.path.exists(path):
      tok = Tokenizer.from_file(path)
    else:
      if config.data.format != "sentences":
        raise ValueError(
            "Training a tokenizer needs a corpus in the official sentence "
            "format; for other formats give config.data.tokenizer.")
      files = sorted(glob.glob(corpus_pattern(config.data.corpus)))
      log.info("Training a %d-piece SentencePiece model on %d file(s) → %s",
               config.model.vocab_size, len(files), path)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      tok = Tokenizer.train(files, config.model.vocab_size, output=path,
                            seed=config.seed,
                            input_sentence_size=2_000_000)
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
      seed=config.seed, eval_fraction=d.eval_fraction,
      num_workers=d.num_workers)


def _recipe_matches(metadata: dict, wanted: prepare_lib.PrepareConfig) -> bool:
  have = metadata.get("config", {})
  keys = ("max_seq_length", "objective", "nsp_negatives_in_sop",
          "short_seq_prob", "dupe_factor", "seed", "eval_fraction")
  return all(have.get(k) == getattr(wanted, k) for k in keys)


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
  metadata = prepare_lib.prepare(docs, wanted, stats)
  log.info("Prepared data:\n%s", prepare_lib.summary(metadata))
  return out


def masking_config(config) -> masking_lib.MaskingConfig:
  m = config.masking
  return masking_lib.MaskingConfig(
      max_predictions=m.max_predictions, masked_lm_prob=m.masked_lm_prob,
      max_ngram=m.max_ngram, favor_shorter_ngram=m.favor_shorter_ngram,
      whole_word=m.whole_word)


def make_loader(config, data_dir: str, split: str, vocab, sharding,
                global_batch_size: int | None = None, seed: int | None = None):
  return loader_lib.Loader(
      data_dir, split, global_batch_size=global_batch_size or config.batch_size,
      vocab=vocab, seed=config.seed if seed is None else seed,
      masking_config=masking_config(config),
      dynamic_masking=config.data.dynamic_masking, sharding=sharding,
      prefetch=config.data.prefetch)


def has_split(data_dir: str, split: str) -> bool:
  meta = loader_lib.read_metadata(data_dir)
  return bool(meta.get("splits", {}).get(split, {}).get("instances", 0))
