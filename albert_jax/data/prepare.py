r"""Corpus → sharded ArrayRecord files of tokenised, unmasked instances.

  python -m albert_jax.data.prepare \
      --input='albert_jax/data/bundled/corpus/*.txt.gz' \
      --tokenizer=/tmp/spm/albert.model --output_dir=/tmp/albert_data \
      --max_seq_length=128 --objective=sop --dupe_factor=2 --num_workers=2

Inputs (`--format`): `sentences` (official format: a sentence per line, a
blank line between documents; globs, comma lists, .gz), `raw` (a document
per file), `jsonl:FIELD`, or `tfds[:SPLIT]` with `--input=name:feature`.
`--input` repeated (with `--format` once, or once per input) makes a
mixture; `--weights=3,0.5` takes each document of the first input three
times and half of the second's, deterministically (`shards.copies`); the
mixture and its per-input counts are recorded in `dataset.json`.

The inputs are cut into units of work (`albert_jax.data.units`: runs of
files of about `--unit_mb` MiB, or ranges of TFDS examples) and host
`--process_index` of `--process_count` (or of JAX's runtime with
`--distributed`) prepares every N-th unit; the host that finishes last
merges the units' records into `dataset.json`. A unit's documents are
numbered from the unit, so the shards are the same bytes for any number of
hosts. Each unit's document stream is cut into blocks of `--docs_per_block`
documents (fewer if they hold over 32M characters); each block is tokenised,
turned into instances and written as one shard by a worker process. At most
two blocks per worker are in flight, so memory is bounded by the block size,
not the corpus size. Document d gets the random stream (seed, dupe, d) and
blocks are cut in the reading process, so the output is byte-identical for
any number of workers. Workers die with the process that started them.

An interrupted prepare resumes: rerun it with the same arguments and units
whose record and shards check out are kept, the others redone; other
parameters are refused (`prepare_run.json` records them; `--overwrite`
starts over). Masking is not materialised: the loader masks on the fly
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
import hashlib
import json
import logging
import multiprocessing
import os
import sys
import time
from typing import Iterator, Mapping, Sequence, TextIO

from albert_jax import storage
from albert_jax.text import documents as documents_lib
from albert_jax.data import instances as instances_lib
from albert_jax.data import shards
from albert_jax.data import units as units_lib
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
  """How to cut the corpus into instances (see InstanceConfig for most).

  `unit_mb` sizes the units of work hosts share (it changes which shards
  are written, so a resume must keep it); `num_workers` changes no byte.
  """
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
  unit_mb: float = 64.0
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
    if not self.unit_mb > 0:
      raise ValueError("unit_mb must be > 0.")
    if self.pack == 1 or self.pack < 0:
      raise ValueError(f"pack={self.pack}: use 0 (one instance per row) or "
                       "K >= 2 instances per row, e.g. 3.")


def prepare(docs: Iterator[list[str]], config: PrepareConfig,
            read_stats: documents_lib.ReadStats | None = None,
            progress: TextIO | None = sys.stderr,
            source: str = "the corpus",
            options: Mapping[str, str] = CLI_OPTIONS,
            overwrite: bool = False) -> dict:
  """Writes the shards of one document stream and `dataset.json`; returns
  the metadata written. The stream is one unit (`prepare_sources` for
  inputs that hosts share, mixtures and resuming unit by unit).

  Args:
    docs: documents, each a list of sentence strings.
    config: the recipe.
    read_stats: the reader's counters (for progress and the metadata).
    progress: where the progress bar goes; None for silence.
    source: the input's name, for error messages and the run record.
    options: how the caller's user sets the input, format and objective
      (keys of CLI_OPTIONS), for error messages.
    overwrite: remove a previous run's output first instead of resuming it
      (or refusing it, when it was prepared with other parameters).

  Raises:
    ValueError: nothing to train on (no documents, or no instances), or
      `output_dir` holds a run with other parameters.
  """
  stats = read_stats if read_stats is not None else documents_lib.ReadStats()
  sources = [units_lib.Source(source, "stream")]
  plan = [units_lib.Unit(0, 0)]
  return _prepare_units(plan, plan, sources, lambda unit: (docs, stats),
                        config, progress=progress, options=options,
                        overwrite=overwrite, read_stats=stats,
                        source_name=source)


def prepare_sources(sources: Sequence[units_lib.Source], config: PrepareConfig,
                    process_index: int = 0, process_count: int = 1,
                    data_dir: str | None = None,
                    progress: TextIO | None = sys.stderr,
                    options: Mapping[str, str] = CLI_OPTIONS,
                    overwrite: bool = False) -> dict | None:
  """Host `process_index` of `process_count` prepares its units of the
  mixture `sources`; the host that finishes last writes `dataset.json`.

  Returns the dataset's metadata if this host wrote it, else None (other
  hosts still have units to write). Run on every host with the same
  arguments but the index; any number of hosts gives the same dataset.
  `data_dir` is TFDS's data directory.
  """
  if not sources:
    raise ValueError(f"No input given; pass {options.get('input', '--input')}.")
  plan = units_lib.plan(sources, config.unit_mb, data_dir)
  mine = units_lib.for_host(plan, process_index, process_count)
  name = " + ".join(repr(s.spec) for s in sources)

  def opener(unit):
    stats = documents_lib.ReadStats()
    src = sources[unit.source]
    docs = open_documents(src.spec, src.format, stats, data_dir=data_dir,
                          paths=list(unit.files), examples=(
                              range(*unit.examples) if unit.examples else None))
    return docs, stats

  return _prepare_units(plan, mine, sources, opener, config,
                        progress=progress, options=options,
                        overwrite=overwrite, read_stats=None,
                        source_name=name, leader=process_index == 0,
                        multihost=process_count > 1)


RUN_RECORD = "prepare_run.json"
# How long a host waits for host 0 to record the run before giving up.
_RUN_RECORD_WAIT_S = 600.0


def _run_record(plan, sources, config: PrepareConfig, source_name: str
                ) -> dict:
  """What must not change between a run and its resumption: the recipe
  (workers aside, which change no byte), the inputs and the tokenizer."""
  recipe = dataclasses.asdict(config)
  for key in ("num_workers", "output_dir", "tokenizer"):
    recipe.pop(key)
  with storage.path(config.tokenizer).open("rb") as f:
    tokenizer = hashlib.sha256(f.read()).hexdigest()[:32]
  return {"format": FORMAT, "recipe": recipe,
          "inputs": [dataclasses.asdict(s) for s in sources],
          "source": source_name, "units": len(plan),
          "plan": units_lib.fingerprint(plan), "tokenizer_sha256": tokenizer}


def _claim(output_dir: str, record: dict, leader: bool, overwrite: bool,
           multihost: bool) -> None:
  """Makes `output_dir` this run's: a new run starts clean (host 0 clears
  what an unrecorded run left); a recorded run with the same parameters is
  resumed; one with other parameters is refused."""
  path = storage.path(output_dir) / RUN_RECORD
  if overwrite:
    if multihost:
      raise ValueError("--overwrite cannot be used with several hosts (they "
                       "would delete each other's shards); empty "
                       f"{output_dir} first, then run every host without it.")
    _clear_outputs(output_dir)
  text = json.dumps(record, indent=1, sort_keys=True)
  if leader:
    if not path.is_file():
      _clear_outputs(output_dir)
    storage.create_if_absent(path, text.encode())
  else:
    deadline = time.monotonic() + _RUN_RECORD_WAIT_S
    while not path.is_file():
      if time.monotonic() > deadline:
        raise RuntimeError(f"Host 0 has not started {output_dir} ({path} "
                           "is missing); start prepare on every host with "
                           "the same arguments.")
      time.sleep(1.0)
  try:
    old = json.loads(path.read_text(encoding="utf-8"))
  except ValueError:
    old = None
  if old == record:
    return
  changed = sorted(k for k in record if not isinstance(old, dict)
                   or old.get(k) != record[k])
  if not isinstance(old, dict):
    changed = ["(the record is damaged)"]
  elif "recipe" in changed:
    changed.remove("recipe")
    changed += [f"recipe.{k}" for k in record["recipe"]
                if old.get("recipe", {}).get(k) != record["recipe"][k]]
  raise ValueError(
      f"{output_dir} holds a preparation with other parameters (changed: "
      f"{', '.join(changed)}; see {path}). Rerun with the recorded ones to "
      "resume it, use another --output_dir, or pass --overwrite to start "
      "over.")


def _prepare_units(plan, mine, sources, opener, config: PrepareConfig, *,
                   progress, options, overwrite: bool,
                   read_stats: documents_lib.ReadStats | None,
                   source_name: str, leader: bool = True,
                   multihost: bool = False) -> dict | None:
  """Writes the units `mine` of `plan` (skipping those already finished),
  then `dataset.json` if every unit of the plan is finished."""
  config.validate()
  from albert_jax.text.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  tok = Tokenizer.from_file(config.tokenizer)
  if tok.cls_id is None or tok.sep_id is None:
    raise ValueError(f"{config.tokenizer} has no [CLS]/[SEP] pieces; train a "
                     "tokenizer with `python -m albert_jax.text.train_tokenizer`.")
  options = {**CLI_OPTIONS, **options}
  record = _run_record(plan, sources, config, source_name)
  _claim(config.output_dir, record, leader, overwrite, multihost)
  todo = [u for u in mine if units_lib.finished(config.output_dir, u.index)
          is None]
  if len(todo) < len(mine):
    log.info("Resuming %s: %d of this host's %d units are finished and "
             "checked; preparing the other %d.", config.output_dir,
             len(mine) - len(todo), len(mine), len(todo))
  done = {s: 0 for s in ("documents", "instances")}
  bar = shards.Progress(progress, read_stats)
  if config.num_workers == 1:
    shards.init_worker(config.tokenizer)
    pool = shards.InProcess()
  else:
    # spawn, not fork: the parent may hold JAX/TF threads, and forking a
    # multithreaded process can deadlock the child. The workers die with
    # this process, so a killed prepare leaves none writing.
    pool = concurrent.futures.ProcessPoolExecutor(
        config.num_workers, mp_context=multiprocessing.get_context("spawn"),
        initializer=shards.init_worker,
        initargs=(config.tokenizer, os.getpid()))
  # Futures of blocks in submission order; a unit's entry after its last
  # block marks it finished once everything before it has been collected.
  pending: list[tuple[str, object]] = []
  written: dict[int, dict[str, list]] = {}

  def drain(limit: int) -> None:
    while len(pending) > limit:  # in submission order: deterministic lists
      kind, item = pending.pop(0)
      if kind == "unit":
        unit, stats = item
        units_lib.write_record(config.output_dir, unit,
                               written.pop(unit.index), stats)
        continue
      split, unit_index, future = item
      try:
        path, stats = future.result()
      except concurrent.futures.process.BrokenProcessPool as e:
        raise RuntimeError(
            "A prepare worker process died: out of memory (lower "
            "--docs_per_block), or prepare() was called from a script "
            "without an `if __name__ == '__main__':` guard, which spawned "
            "workers need. --num_workers=1 runs without workers.") from e
      written[unit_index][split].append((path, stats))
      done["documents"] += stats.documents
      done["instances"] += stats.instances
      bar.update(done["documents"], done["instances"])

  with pool:
    for unit in todo:
      docs, stats = opener(unit)
      written[unit.index] = {s: [] for s in SPLITS}
      for split, block, first, block_docs in shards.document_blocks(
          docs, config.eval_fraction, config.docs_per_block,
          unit.first_index, sources[unit.source].weight, config.seed):
        pending.append(("block", (split, unit.index, pool.submit(
            shards.write_block, split, unit.index, block, first, block_docs,
            config.output_dir, config.instance_config(), config.seed,
            config.pack))))
        drain(2 * config.num_workers)
      pending.append(("unit", (unit, stats)))
    drain(0)
  bar.update(done["documents"], done["instances"], final=True)
  # Other hosts' units were checked by their hosts, and this host's just
  # now: only their records are read.
  records = [units_lib.finished(config.output_dir, u.index, check=False)
             for u in plan]
  if any(r is None for r in records):
    return None  # another host's units are still being written
  merged = units_lib.merge(records, sources, SPLITS)
  try:
    _check_nonempty(merged["totals"], config, source_name, options)
  except ValueError:
    _clear_outputs(config.output_dir)  # nothing usable: leave nothing
    raise
  metadata = {
      "format": FORMAT,
      "tokenizer": storage.as_str(config.tokenizer),
      "vocab_size": tok.vocab_size,
      "max_seq_length": config.max_seq_length,
      "objective": config.objective,
      "config": dataclasses.asdict(config),
      "read": dataclasses.asdict(merged["read"]),
      "mixture": merged["mixture"],
      "units": len(plan),
      "splits": {s: {"files": merged["files"][s],
                     **dataclasses.asdict(merged["totals"][s])}
                 for s in SPLITS},
  }
  # Written last, whole: its presence marks the set complete. Hosts that
  # finish together write the same bytes.
  storage.write_atomic(storage.path(config.output_dir) / "dataset.json",
                       json.dumps(metadata, indent=2))
  return metadata


def _clear_outputs(output_dir: str) -> None:
  """Removes a previous run's shards and records so none can mix with this
  run's."""
  directory = storage.path(output_dir)
  directory.mkdir(parents=True, exist_ok=True)  # a no-op on gs://
  # dataset.json first: a set without it is incomplete to every reader.
  (directory / "dataset.json").unlink(missing_ok=True)
  (directory / RUN_RECORD).unlink(missing_ok=True)
  for split in SPLITS:
    for path in directory.glob(f"{split}-*.arrayrecord*"):
      path.unlink(missing_ok=True)
  records = directory / units_lib.UNITS_DIR
  for path in records.glob("unit-*.json*"):
    path.unlink(missing_ok=True)
  if records.is_dir() and not any(records.iterdir()):
    records.rmdir()  # local only: Cloud Storage has no empty folders


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
  mixture = metadata.get("mixture") or []
  if len(mixture) > 1:
    for m in mixture:
      lines.append(f"input {m['input']} (weight {m['weight']:g}): "
                   f"{m['read_documents']:,} documents read, "
                   f"{m['documents']:,} taken, {m['instances']:,} instances.")
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
                   data_dir: str | None = None,
                   paths: Sequence[str] | None = None,
                   examples: range | None = None) -> Iterator[list[str]]:
  """Documents for `--input` in `--format` (sentences, raw, jsonl:FIELD,
  tfds[:SPLIT]); only `paths` of the input's files, or `examples` of a
  TFDS split, when given (one unit's share)."""
  if fmt == "sentences":
    return documents_lib.read_sentence_files(
        paths or documents_lib.expand_paths(spec), stats)
  if fmt == "raw":
    return documents_lib.read_raw_files(
        paths or documents_lib.expand_paths(spec), None, stats)
  if fmt.startswith("jsonl:") and fmt[len("jsonl:"):]:
    return documents_lib.read_raw_files(
        paths or documents_lib.expand_paths(spec), fmt[len("jsonl:"):], stats)
  if fmt == "tfds" or fmt.startswith("tfds:"):
    split = fmt.split(":", 1)[1] if ":" in fmt else "train"
    return documents_lib.read_tfds(spec, split, process_index=process_index,
                                   process_count=process_count,
                                   data_dir=data_dir, stats=stats,
                                   examples=examples)
  raise ValueError(f"Unknown --format {fmt!r}; use sentences, raw, "
                   "jsonl:FIELD or tfds[:SPLIT].")


def sources_from_flags(inputs: Sequence[str], formats: Sequence[str],
                       weights: str | None) -> list[units_lib.Source]:
  """The mixture that repeated --input, --format and --weights describe."""
  formats = list(formats) or ["sentences"]
  if len(formats) not in (1, len(inputs)):
    raise ValueError(f"{len(formats)} --format flags for {len(inputs)} "
                     "--input flags; give one --format for all inputs, or "
                     "one per --input, in the same order.")
  if weights:
    try:
      values = [float(w) for w in weights.split(",")]
    except ValueError:
      raise ValueError(f"--weights={weights!r} is not a comma-separated list "
                       "of numbers, e.g. --weights=3,1.") from None
    if len(values) != len(inputs):
      raise ValueError(f"--weights has {len(values)} values for "
                       f"{len(inputs)} --input flags; give one weight per "
                       "--input, in the same order.")
  else:
    values = [1.0] * len(inputs)
  sources = [units_lib.Source(i, formats[k if len(formats) > 1 else 0], w)
             for k, (i, w) in enumerate(zip(inputs, values))]
  for source in sources:
    source.validate()
  return sources


def host_from_flags(process_index: int | None, process_count: int | None,
                    distributed: bool) -> tuple[int, int]:
  """(index, count) of this host: the flags, else the JAX runtime's
  (`--distributed` initialises it as `albert_jax.main --distributed` does,
  e.g. under `tpu_setup.sh run`), else (0, 1)."""
  if (process_index is None) != (process_count is None):
    raise ValueError("Give --process_index and --process_count together (or "
                     "neither, with --distributed on a pod).")
  if process_index is not None:
    return process_index, process_count
  if distributed:
    import jax  # pylint: disable=g-import-not-at-top
    if not jax.distributed.is_initialized():
      jax.distributed.initialize()
    return jax.process_index(), jax.process_count()
  return 0, 1


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--input", required=True, action="append",
                 help="file glob(s), comma-separated; or a TFDS name:feature."
                 " Repeat for a mixture of inputs (see --weights).")
  p.add_argument("--format", action="append", default=[],
                 help="sentences | raw | jsonl:FIELD | tfds[:SPLIT]; once "
                 "for all inputs, or once per --input")
  p.add_argument("--weights", default=None,
                 help="one weight per --input, comma-separated: each "
                 "document is taken WEIGHT times on average (3 = thrice, "
                 "0.5 = half of them), deterministically")
  p.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir")
  p.add_argument("--tokenizer", required=True, help="SentencePiece .model")
  p.add_argument("--output_dir", required=True)
  p.add_argument("--process_index", type=int, default=None,
                 help="this host's number, 0..N-1 (default: the JAX "
                 "runtime's with --distributed, else 0)")
  p.add_argument("--process_count", type=int, default=None,
                 help="the number of hosts N sharing the work")
  p.add_argument("--distributed", action="store_true",
                 help="take the host's place from jax.distributed (TPU pods)")
  p.add_argument("--overwrite", action="store_true",
                 help="delete a previous preparation in --output_dir first "
                 "instead of resuming it (one host only)")
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
  try:
    index, count = host_from_flags(args.process_index, args.process_count,
                                   args.distributed)
    sources = sources_from_flags(args.input, args.format, args.weights)
    metadata = prepare_sources(sources, config, index, count,
                               data_dir=args.tfds_data_dir,
                               overwrite=args.overwrite)
  except (ValueError, FileNotFoundError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if metadata is None:
    print(f"host {index} of {count}: done; the last host to finish writes "
          f"{storage.path(config.output_dir) / 'dataset.json'}")
    return 0
  print(summary(metadata))
  print(f"wrote {storage.path(config.output_dir) / 'dataset.json'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
