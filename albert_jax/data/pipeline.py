"""The trainer's prepared data: instances built once per workdir and recipe.

With `config.data.data_dir` empty, the first run prepares the corpus inside
the workdir (with the tokenizer from `albert_jax.text.run_tokenizer`), and
later runs (resumes) reuse it; a prepared dataset whose recipe no longer
matches the config is rebuilt rather than silently reused. The workdir, the
corpus and `config.data.data_dir` are local or `gs://` (`albert_jax.storage`).
"""

from __future__ import annotations

import dataclasses
import logging
import os

from albert_jax import storage
from albert_jax.text import documents as documents_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import masking as masking_lib
from albert_jax.data import prepare as prepare_lib

log = logging.getLogger(__name__)

# The settings a data error may ask the trainer's user to change.
TRAINER_OPTIONS = {"input": "config.data.corpus",
                   "format": "config.data.format",
                   "objective": "--config.data.objective",
                   "eval_fraction": "config.data.eval_fraction"}


def _prepare_config(d, seed: int, tokenizer_path: str, output_dir: str):
  """The `PrepareConfig` of a run's `config.data` section `d` and seed."""
  return prepare_lib.PrepareConfig(
      tokenizer=tokenizer_path, output_dir=output_dir,
      max_seq_length=d.max_seq_length, objective=d.objective,
      nsp_negatives_in_sop=d.nsp_negatives_in_sop,
      short_seq_prob=d.short_seq_prob, dupe_factor=d.dupe_factor,
      exact_length=d.exact_length, seed=seed,
      eval_fraction=d.eval_fraction,
      num_workers=d.num_workers, pack=d.pack)


def _recipe_matches(metadata: dict, wanted: prepare_lib.PrepareConfig) -> bool:
  have = metadata.get("config", {})
  keys = ("max_seq_length", "objective", "nsp_negatives_in_sop",
          "short_seq_prob", "dupe_factor", "exact_length", "seed",
          "eval_fraction", "pack")
  # Data prepared before a field existed was prepared with its default.
  defaults = {f.name: f.default
              for f in dataclasses.fields(prepare_lib.PrepareConfig)}
  return all(have.get(k, defaults[k]) == getattr(wanted, k) for k in keys)


def ensure_dataset(data, workdir: str, tokenizer, *, seed: int) -> str:
  """The prepared data directory: configured, or built in WORKDIR/data.

  Args:
    data: the run's `config.data` section: data_dir (a prepared one, whose
      length, objective and packing must be the section's), else corpus and
      format, and the recipe (max_seq_length, objective,
      nsp_negatives_in_sop, short_seq_prob, dupe_factor, exact_length,
      eval_fraction, num_workers, pack) it is prepared by.
    workdir: the run's workdir (local or gs://).
    tokenizer: the run's tokenizer (`run_tokenizer.ensure`).
    seed: `config.seed`, part of the recipe.
  """
  if data.data_dir:
    meta = loader_lib.read_metadata(data.data_dir)
    if int(meta["max_seq_length"]) != data.max_seq_length:
      raise ValueError(
          f"{data.data_dir} holds instances of length "
          f"{meta['max_seq_length']} but config.data.max_seq_length is "
          f"{data.max_seq_length}.")
    # Data prepared before the field was recorded was prepared for SOP.
    prepared = meta.get("config", {}).get("objective", "sop")
    if prepared != data.objective:
      raise ValueError(
          f"{data.data_dir} was prepared for data.objective="
          f"{prepared!r} but config.data.objective is "
          f"{data.objective!r}: its sentence labels mean something "
          f"else. Set --config.data.objective={prepared}, or prepare the "
          f"data again with --objective {data.objective}.")
    packed = loader_lib.max_per_row(meta)
    if packed != data.pack:
      raise ValueError(
          f"{data.data_dir} was prepared with pack={packed} but "
          f"config.data.pack is {data.pack}; set "
          f"--config.data.pack={packed}, or prepare the data again with "
          f"--pack {data.pack}.")
    return data.data_dir
  import jax  # pylint: disable=g-import-not-at-top
  out = os.fspath(storage.path(workdir) / "data")
  wanted = _prepare_config(data, seed, tokenizer.path, out)
  if (storage.path(out) / loader_lib.METADATA).exists() and _recipe_matches(
      loader_lib.read_metadata(out), wanted):
    return out
  if jax.process_count() > 1:
    raise ValueError(
        "Multi-host runs read prepared data; run `python -m "
        "albert_jax.data.prepare` once and set config.data.data_dir.")
  log.info("Preparing %s → %s", data.corpus, out)
  stats = documents_lib.ReadStats()
  docs = prepare_lib.open_documents(documents_lib.corpus_pattern(data.corpus),
                                    data.format, stats)
  # Rebuilt whole: the recipe changed (checked above), or a run died while
  # preparing it (the stream's content is not fingerprinted, so no resume).
  metadata = prepare_lib.prepare(
      docs, wanted, stats, source=f"config.data.corpus={data.corpus!r}",
      options=TRAINER_OPTIONS, overwrite=True)
  log.info("Prepared data:\n%s", prepare_lib.summary(metadata))
  return out


def masking_config(m) -> masking_lib.MaskingConfig:
  """The loader's masking recipe from a run's `config.masking` section."""
  return masking_lib.MaskingConfig(
      max_predictions=m.max_predictions, masked_lm_prob=m.masked_lm_prob,
      max_ngram=m.max_ngram, favor_shorter_ngram=m.favor_shorter_ngram,
      whole_word=m.whole_word, mask_token_prob=m.mask_token_prob,
      random_token_prob=m.random_token_prob)


def make_loader(data, masking, data_dir: str, split: str, vocab, sharding,
                *, global_batch_size: int, seed: int):
  """The loader of `data_dir`'s `split`, as the run's config sets it up.

  Args:
    data: the run's `config.data` section (dynamic_masking, prefetch).
    masking: its `config.masking` section (`masking_config`), or None for
      objectives that read the unmasked token stream (causal LM).
    data_dir, split: the prepared data and the split to read.
    vocab: the tokenizer's `loader.Vocabulary`.
    sharding: where the global batch goes (None: this host's arrays).
    global_batch_size: rows per step, all hosts together
      (`config.batch_size`).
    seed: the shuffle's and the masks' seed (`config.seed`; the eval
      loader's is one more).
  """
  return loader_lib.Loader(
      data_dir, split, global_batch_size=global_batch_size, vocab=vocab,
      seed=seed,
      masking_config=None if masking is None else masking_config(masking),
      dynamic_masking=data.dynamic_masking, sharding=sharding,
      prefetch=data.prefetch)


def has_split(data_dir: str, split: str) -> bool:
  meta = loader_lib.read_metadata(data_dir)
  return bool(meta.get("splits", {}).get(split, {}).get("instances", 0))
