r"""Corpus → sharded ArrayRecord files of tokenised, unmasked instances.

  python -m albert_jax.data.prepare \
      --input='albert_jax/data/bundled/corpus/*.txt.gz' \
      --tokenizer=/tmp/spm/albert.model --output_dir=/tmp/albert_data \
      --max_seq_length=128 --objective=sop --dupe_factor=2 --num_workers=2

Inputs (`--format`): `sentences` (official format: a sentence per line, a
blank line between documents; globs, comma lists, .gz), `raw` (a document
per file), `jsonl:FIELD`, or `tfds[:SPLIT]` with `--input=name:feature`.

The corpus is streamed in blocks of `--docs_per_block` documents (fewer if
they hold over 32M characters); each block is tokenised, turned into
instances and written as one shard by a worker process. At most two blocks
per worker are in flight, so memory is bounded by the block size, not the
corpus size. Document d gets the random stream (seed, dupe, d) and blocks
are cut in the reading process, so the output is byte-identical for any
number of workers. Masking is not materialised: the loader masks on the fly
(statically or dynamically), so one prepared dataset serves both. A
deterministic fraction of documents (`--eval_fraction`, by document index
hash) goes to `eval-*` shards for held-out evaluation. With `--pack K` each
record is a row of up to K instances, packed best-fit decreasing within the
block (`instances.pack_rows`): packing once, here, rather than in the
loader keeps every batch a function of (seed, step) alone
(experiments/benchmarks/packing.py measures both). The blocks, and the
worker that writes each one's shard, are `albert_jax.data.shards`. Inputs,
the tokenizer and `--output_dir` are local or `gs://` (`albert_jax.storage`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import sys
from typing import Iterator, Mapping, Sequence, TextIO

from albert_jax import storage
from albert_jax.data import documents as documents_lib
from albert_jax.data import instances as instances_lib
from albert_jax.data import shards
from albert_jax.data.shards import is_eval_document
from albert_jax.data.shards import shard_name
from albert_jax.data.shards import SPLITS

# Blocks and their shards are albert_jax.data.shards's; callers know
# is_eval_document and shard_name as this module's.
__all__ = ["CLI_OPTIONS", "FORMAT", "SPLITS", "PrepareConfig",
           "is_eval_document", "main", "open_documents", "prepare",
           "shard_name", "summary"]

log = logging.getLogger(__name__)

FORMAT = "albert_jax.instances/1"
# What an error asks the user to change, by the names of this CLI's flags;
# other front ends (the trainer) pass their own names to `prepare`.
CLI_OPTIONS = {"input": "--input", "format": "--format",
               "objective": "--objective", "eval_fraction": "--eval_fraction"}


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
  """How to cut the corpus into instances (see InstanceConfig for most)."""
  tokenizer: str
  output_dir: str
  max_seq_length: int = 512
  objective: str = "sop"
  nsp_negatives_in_sop: bool = False
  short_seq_prob: float = 0.1
  dupe_factor: int = 1
  exact_length: bool = False
  seed: int = 12345
  docs_per_block: int = 2000
  eval_fraction: float = 0.0
  num_workers: int = 1
  # K >= 2: records are rows of up to K instances packed per block
  # (`instances.pack_rows`); 0: one instance per record.
  pack: int = 0

  def instance_config(self) -> instances_lib.InstanceConfig:
    return instances_lib.InstanceConfig(
        max_seq_length=self.max_seq_length,
        short_seq_prob=self.short_seq_prob, objective=self.objective,
        nsp_negatives_in_sop=self.nsp_negatives_in_sop,
        dupe_factor=self.dupe_factor, exact_length=self.exact_length)

  def validate(self) -> None:
    self.instance_config()  # raises on a bad recipe
    if self.docs_per_block < 1:
      raise ValueError("docs_per_block must be >= 1.")
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ValueError("eval_fraction must be in [0, 1).")
    if self.num_workers < 1:
      raise ValueError("num_workers must be >= 1.")
    if self.pack == 1 or self.pack < 0:
      raise ValueError(f"pack={self.pack}: use 0 (one instance per row) or "
                       "K >= 2 instances per row, e.g. 3.")


def prepare(docs: Iterator[list[str]], config: PrepareConfig,
            read_stats: documents_lib.ReadStats | None = None,
            progress: TextIO | None = sys.stderr,
            source: str = "the corpus",
            options: Mapping[str, str] = CLI_OPTIONS) -> dict:
  """Writes shards and `dataset.json`; returns the metadata written.

  A previous run's shards in `output_dir` are removed first, and this
  run's on failure; `dataset.json` is written last. With num_workers > 1
  the workers are spawned, so a calling script needs the usual
  `if __name__ == "__main__":` guard.

  Args:
    docs: documents, each a list of sentence strings.
    config: the recipe.
    read_stats: the reader's counters (for progress and the metadata).
    progress: where the progress bar goes; None for silence.
    source: the input's name, for error messages.
    options: how the caller's user sets the input, format and objective
      (keys of CLI_OPTIONS), for error messages.

  Raises:
    ValueError: nothing to train on (no documents, or no instances).
  """
  config.validate()
  from albert_jax.text.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  tok = Tokenizer.from_file(config.tokenizer)
  if tok.cls_id is None or tok.sep_id is None:
    raise ValueError(f"{config.tokenizer} has no [CLS]/[SEP] pieces; train a "
                     "tokenizer with `python -m albert_jax.text.train`.")
  _clear_outputs(config.output_dir)
  totals = {s: instances_lib.Stats() for s in SPLITS}
  files = {s: [] for s in SPLITS}
  bar = shards.Progress(progress, read_stats)
  if config.num_workers == 1:
    shards.init_worker(config.tokenizer)
    pool = shards.InProcess()
  else:
    # spawn, not fork: the parent may hold JAX/TF threads, and forking a
    # multithreaded process can deadlock the child.
    pool = concurrent.futures.ProcessPoolExecutor(
        config.num_workers, mp_context=multiprocessing.get_context("spawn"),
        initializer=shards.init_worker, initargs=(config.tokenizer,))
  pending: list[tuple[str, concurrent.futures.Future]] = []

  def drain(limit: int) -> None:
    while len(pending) > limit:  # in submission order: deterministic lists
      split, future = pending.pop(0)
      try:
        path, stats = future.result()
      except concurrent.futures.process.BrokenProcessPool as e:
        raise RuntimeError(
            "A prepare worker process died: out of memory (lower "
            "--docs_per_block), or prepare() was called from a script "
            "without an `if __name__ == '__main__':` guard, which spawned "
            "workers need. --num_workers=1 runs without workers.") from e
      files[split].append(storage.path(path).name)
      totals[split].add(stats)
      bar.update(sum(t.documents for t in totals.values()),
                 sum(t.instances for t in totals.values()))

  try:
    with pool:
      for split, block, first, block_docs in shards.document_blocks(
          docs, config.eval_fraction, config.docs_per_block):
        pending.append((split, pool.submit(
            shards.write_block, split, block, first, block_docs,
            config.output_dir, config.instance_config(), config.seed,
            config.pack)))
        drain(2 * config.num_workers)
      drain(0)
    bar.update(sum(t.documents for t in totals.values()),
               sum(t.instances for t in totals.values()), final=True)
    _check_nonempty(totals, config, source, {**CLI_OPTIONS, **options})
  except BaseException:
    _clear_outputs(config.output_dir)  # no half-written dataset left behind
    raise
  metadata = {
      "format": FORMAT,
      "tokenizer": storage.as_str(config.tokenizer),
      "vocab_size": tok.vocab_size,
      "max_seq_length": config.max_seq_length,
      "objective": config.objective,
      "config": dataclasses.asdict(config),
      "read": dataclasses.asdict(read_stats) if read_stats else None,
      "splits": {s: {"files": files[s], **dataclasses.asdict(totals[s])}
                 for s in SPLITS},
  }
  # Written last, whole: its presence marks the set complete.
  storage.write_atomic(storage.path(config.output_dir) / "dataset.json",
                       json.dumps(metadata, indent=2))
  return metadata


def _clear_outputs(output_dir: str) -> None:
  """Removes a previous run's shards so none can mix with this run's."""
  directory = storage.path(output_dir)
  directory.mkdir(parents=True, exist_ok=True)  # a no-op on gs://
  # dataset.json first: a set without it is incomplete to every reader.
  (directory / "dataset.json").unlink(missing_ok=True)
  for split in SPLITS:
    for path in directory.glob(f"{split}-*.arrayrecord*"):
      path.unlink(missing_ok=True)


def _check_nonempty(totals: dict[str, instances_lib.Stats],
                    config: PrepareConfig, source: str,
                    options: Mapping[str, str]) -> None:
  documents = sum(t.documents for t in totals.values())
  if documents == 0:
    raise ValueError(
        f"Nothing to train on: {source} holds no documents. Check "
        f"{options['input']} and {options['format']} (sentences: one "
        "sentence per line, a blank line between documents).")
  train = totals["train"]
  if train.instances:
    return
  single = sum(t.skipped_documents for t in totals.values())
  if config.objective == "sop" and single == documents:
    raise ValueError(
        f"Nothing to train on: all {documents} documents of {source} have a "
        "single sentence, and sentence-order prediction needs documents of "
        "at least 2 sentences. Add documents of several sentences "
        "(separated by blank lines, not after every line), or use "
        f"{options['objective']}=none, which needs no sentence pairs.")
  raise ValueError(
      f"Nothing to train on: {documents} documents of {source} gave no "
      f"training instances ({single} had a single sentence, "
      f"{train.skipped_chunks} chunks were skipped, "
      f"{train.documents} documents fell in the train split). Add more "
      f"text, or lower {options['eval_fraction']} if the held-out split "
      "took the documents.")


def summary(metadata: dict) -> str:
  """A closing table: documents, sentences, instances, tokens, padding."""
  seq = metadata["max_seq_length"]
  lines = [f"{'split':<6} {'documents':>10} {'sentences':>10} "
           f"{'instances':>10} {'tokens':>12} {'padding':>8} {'skipped':>8}"]
  for split, s in metadata["splits"].items():
    if not s["documents"]:
      continue
    padding = 1 - s["tokens"] / max(s.get("rows", s["instances"]) * seq, 1)
    lines.append(f"{split:<6} {s['documents']:>10,} {s['sentences']:>10,} "
                 f"{s['instances']:>10,} {s['tokens']:>12,} {padding:>8.1%} "
                 f"{s['skipped_documents'] + s['skipped_chunks']:>8,}")
  lines.append("skipped: single-sentence documents + chunks that made no "
               "instance; padding: share of pad tokens at max_seq_length.")
  read = metadata.get("read") or {}
  kinds = (("skipped_non_utf8", "non-UTF-8 lines"),
           ("skipped_long_lines", "over-long lines"),
           ("skipped_records", "unusable records"),
           ("skipped_files", "damaged file ends"))
  if any(read.get(k) for k, _ in kinds):
    lines.append("input: skipped " + ", ".join(
        f"{read.get(k, 0):,} {what}" for k, what in kinds) + ".")
  return "\n".join(lines)


def open_documents(spec: str, fmt: str, stats: documents_lib.ReadStats,
                   process_index: int = 0, process_count: int = 1,
                   data_dir: str | None = None) -> Iterator[list[str]]:
  """Documents for `--input` in `--format` (sentences, raw, jsonl:FIELD,
  tfds[:SPLIT])."""
  if fmt == "sentences":
    return documents_lib.read_sentence_files(
        documents_lib.expand_paths(spec), stats)
  if fmt == "raw":
    return documents_lib.read_raw_files(documents_lib.expand_paths(spec),
                                        None, stats)
  if fmt.startswith("jsonl:") and fmt[len("jsonl:"):]:
    return documents_lib.read_raw_files(documents_lib.expand_paths(spec),
                                        fmt[len("jsonl:"):], stats)
  if fmt == "tfds" or fmt.startswith("tfds:"):
    split = fmt.split(":", 1)[1] if ":" in fmt else "train"
    return documents_lib.read_tfds(spec, split, process_index=process_index,
                                   process_count=process_count,
                                   data_dir=data_dir, stats=stats)
  raise ValueError(f"Unknown --format {fmt!r}; use sentences, raw, "
                   "jsonl:FIELD or tfds[:SPLIT].")


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--input", required=True,
                 help="file glob(s), comma-separated; or a TFDS name:feature")
  p.add_argument("--format", default="sentences",
                 help="sentences | raw | jsonl:FIELD | tfds[:SPLIT]")
  p.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir")
  p.add_argument("--tokenizer", required=True, help="SentencePiece .model")
  p.add_argument("--output_dir", required=True)
  for field in dataclasses.fields(PrepareConfig):
    if field.name in ("tokenizer", "output_dir"):
      continue
    kind = type(field.default)
    if kind is bool:
      p.add_argument(f"--{field.name}", action=argparse.BooleanOptionalAction,
                     default=field.default)
    else:
      choices = instances_lib.OBJECTIVES if field.name == "objective" else None
      p.add_argument(f"--{field.name}", type=kind, default=field.default,
                     choices=choices)
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  config = PrepareConfig(**{f.name: getattr(args, f.name)
                            for f in dataclasses.fields(PrepareConfig)})
  stats = documents_lib.ReadStats()
  try:
    docs = open_documents(args.input, args.format, stats,
                          data_dir=args.tfds_data_dir)
    metadata = prepare(docs, config, stats, source=repr(args.input))
  except (ValueError, FileNotFoundError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(summary(metadata))
  print(f"wrote {storage.path(config.output_dir) / 'dataset.json'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
