"""The corpus as units of work: dealt to hosts, recorded when done, merged.

A mixture is a list of `Source`s (an input, its format and its weight). Each
source is cut into units: runs of consecutive files of about `unit_mb` MiB
(a file is never split), or ranges of `TFDS_UNIT_EXAMPLES` examples of a
TFDS split. The cut depends only on the inputs, never on the number of
hosts, and a unit's documents are numbered from `first_index(unit)`, so a
unit's shards are the same bytes whichever host writes them: host i of N
takes units i, i + N, i + 2N, ... and N = 1 and N = 3 write the same files.

When a unit's shards are all written, a record of them (names, sizes,
instance counts, counters) is written to `units/unit-NNNNN.json`; a rerun
keeps a unit whose record and shards check out and redoes the others. When
every unit has its record, `merge` builds the one `dataset.json` the loader
reads, listing the shards in unit order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from typing import Any, Sequence

from albert_jax import storage
from albert_jax.text import documents as documents_lib
from albert_jax.data import instances as instances_lib
from albert_jax.data import shards

log = logging.getLogger(__name__)

UNITS_DIR = "units"
TFDS_UNIT_EXAMPLES = 10_000
# Unit u's documents are numbered from u << 40: far apart enough that no
# two units' numbers (and so random streams) meet, and 0 for unit 0, so a
# single-unit corpus numbers its documents 0, 1, 2, ... as before units.
_INDEX_BITS = 40


@dataclasses.dataclass(frozen=True)
class Source:
  """One input of a mixture: `spec` (globs or a TFDS name:feature) read in
  `format`, each document taken `weight` times on average."""
  spec: str
  format: str = "sentences"
  weight: float = 1.0

  def validate(self) -> None:
    """Checked before anything is written, so a typo is not recorded as
    the run's parameters (which a corrected rerun would then differ from)."""
    fmt = self.format
    if not (fmt in ("sentences", "raw", "tfds", "stream") or
            (fmt.startswith(("jsonl:", "tfds:")) and fmt.split(":", 1)[1])):
      raise ValueError(f"Unknown --format {fmt!r}; use sentences, raw, "
                       "jsonl:FIELD or tfds[:SPLIT].")
    if not (math.isfinite(self.weight) and self.weight > 0):
      raise ValueError(f"The weight of {self.spec!r} is {self.weight}; give "
                       "each input a positive weight (2 = every document "
                       "twice, 0.5 = half of them).")

  @property
  def is_tfds(self) -> bool:
    return self.format == "tfds" or self.format.startswith("tfds:")


@dataclasses.dataclass(frozen=True)
class Unit:
  """Unit `index` of the corpus: `files` of source `source`, or the TFDS
  examples [start, stop)."""
  index: int
  source: int
  files: tuple[str, ...] = ()
  sizes: tuple[int, ...] = ()
  examples: tuple[int, int] | None = None

  @property
  def first_index(self) -> int:
    return self.index << _INDEX_BITS


def plan(sources: Sequence[Source], unit_mb: float,
         data_dir: str | None = None) -> list[Unit]:
  """Every unit of the mixture, in order (the same list on every host)."""
  units: list[Unit] = []
  limit = unit_mb * (1 << 20)
  for s, source in enumerate(sources):
    source.validate()
    if source.is_tfds:
      split = source.format.split(":", 1)[1] if ":" in source.format else (
          "train")
      total = _tfds_num_examples(source.spec, split, data_dir)
      for start in range(0, total, TFDS_UNIT_EXAMPLES):
        units.append(Unit(len(units), s, examples=(
            start, min(start + TFDS_UNIT_EXAMPLES, total))))
      continue
    files, sizes, held = [], [], 0
    for path in documents_lib.expand_paths(source.spec):
      files.append(path)
      sizes.append(storage.path(path).stat().length)
      held += sizes[-1]
      if held >= limit:
        units.append(Unit(len(units), s, tuple(files), tuple(sizes)))
        files, sizes, held = [], [], 0
    if files:
      units.append(Unit(len(units), s, tuple(files), tuple(sizes)))
  return units


def _tfds_num_examples(spec: str, split: str, data_dir: str | None) -> int:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name, _ = documents_lib.parse_tfds_spec(spec)
  try:
    return len(tfds.data_source(name, split=split, data_dir=data_dir))
  except NotImplementedError:  # no random access for this file format
    return tfds.builder(name, data_dir=data_dir).info.splits[
        split].num_examples


def for_host(units: Sequence[Unit], process_index: int,
             process_count: int) -> list[Unit]:
  """Host `process_index`'s units: every `process_count`-th, round robin
  (neighbouring files are often alike in size, so hosts get even shares)."""
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"--process_index {process_index} is not in [0, "
                     f"--process_count {process_count}); number the hosts "
                     "0 to N-1 and give each the same --process_count N.")
  return list(units[process_index::process_count])


def fingerprint(units: Sequence[Unit]) -> str:
  """A digest of the plan: which files (by size) and examples, in order."""
  digest = hashlib.sha256()
  for u in units:
    digest.update(json.dumps([u.source, u.files, u.sizes, u.examples])
                  .encode())
  return digest.hexdigest()[:32]


def record_path(output_dir: str, unit: int) -> storage.epath.Path:
  return storage.path(output_dir) / UNITS_DIR / f"unit-{unit:05d}.json"


def write_record(output_dir: str, unit: Unit,
                 shards: dict[str, list[tuple[str, instances_lib.Stats]]],
                 read: documents_lib.ReadStats) -> None:
  """Records a finished unit: its shards (name, bytes, instances, and
  records: packed rows or instances) per split, the split totals and the
  reader's counters. Written whole, last."""
  splits = {}
  for split, written in shards.items():
    total = instances_lib.Stats()
    for _, stats in written:
      total.add(stats)
    splits[split] = {
        "shards": [{"name": storage.path(p).name,
                    "bytes": storage.path(p).stat().length,
                    "instances": stats.instances, "records": stats.rows}
                   for p, stats in written],
        **dataclasses.asdict(total)}
  path = record_path(output_dir, unit.index)
  path.parent.mkdir(parents=True, exist_ok=True)  # a no-op on gs://
  storage.write_atomic(path, json.dumps(
      {"unit": unit.index, "source": unit.source, "splits": splits,
       "read": dataclasses.asdict(read)}, indent=1))


def finished(output_dir: str, unit: int, check: bool = True
             ) -> dict[str, Any] | None:
  """Unit `unit`'s record if it and (with `check`) every shard it lists
  check out (shard present, of its recorded size and number of records);
  None otherwise, and the unit is redone."""
  path = record_path(output_dir, unit)
  if not path.is_file():
    return None
  try:
    record = json.loads(path.read_text(encoding="utf-8"))
    shards = [s for split in record["splits"].values()
              for s in split["shards"]]
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    log.warning("%s is damaged (%s); preparing unit %d again.", path, e, unit)
    return None
  for shard in shards if check else ():
    where = storage.path(output_dir) / shard["name"]
    problem = _shard_problem(where, shard)
    if problem:
      log.warning("%s %s; preparing unit %d again.", where, problem, unit)
      return None
  return record


def _shard_problem(path, shard: dict[str, Any]) -> str | None:
  if not path.is_file():
    return "is missing"
  size = path.stat().length
  if size != shard["bytes"]:
    return f"has {size} bytes, not the {shard['bytes']} recorded"
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  try:
    reader = array_record_module.ArrayRecordReader(os.fspath(path))
    try:
      count = reader.num_records()
    finally:
      reader.close()  # raises what the reader met (it counts 0 records then)
  except Exception as e:  # pylint: disable=broad-except
    message = shards.unserved([os.fspath(path)], e)
    if message:  # Cloud Storage's failure: preparing again would not help
      raise shards.ShardReadError(message) from e
    return f"cannot be read ({str(e).splitlines()[0][:120]})"
  # Packed shards hold fewer records (rows) than instances; a record
  # written before "records" was recorded held one instance.
  expected = shard.get("records", shard["instances"])
  if count != expected:
    return f"holds {count} records, not the {expected} recorded"
  return None


def merge(records: Sequence[dict[str, Any]], sources: Sequence[Source],
          splits: Sequence[str]) -> dict[str, Any]:
  """The whole dataset's shards, totals, reader counters and per-source
  counts from every unit's record (in unit order)."""
  files = {s: [] for s in splits}
  totals = {s: instances_lib.Stats() for s in splits}
  read = documents_lib.ReadStats()
  mixture = [{"input": s.spec, "format": s.format, "weight": s.weight,
              "read_documents": 0, "documents": 0, "instances": 0}
             for s in sources]
  for record in sorted(records, key=lambda r: r["unit"]):
    entry = mixture[record["source"]]
    for split in splits:
      got = record["splits"].get(split)
      if not got:
        continue
      files[split].extend(s["name"] for s in got["shards"])
      totals[split].add(instances_lib.Stats(**{
          f.name: got[f.name] for f in dataclasses.fields(instances_lib.Stats)}))
      entry["documents"] += got["documents"]
      entry["instances"] += got["instances"]
    for f in dataclasses.fields(documents_lib.ReadStats):
      if f.name.startswith("total_"):
        continue
      value = record["read"].get(f.name, 0)
      setattr(read, f.name, getattr(read, f.name) + value)
    entry["read_documents"] += record["read"].get("documents", 0)
  return {"files": files, "totals": totals, "read": read, "mixture": mixture}
