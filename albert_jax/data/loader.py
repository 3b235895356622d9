"""Prepared instances → masked, sharded global batches, exactly resumable.

The batch of global step s is a pure function of (seed, s): position
p = s·global_batch + row of an endless sequence of epochs, each epoch a fresh
global permutation of all records (grain's index shuffle, O(1) memory), so
resuming at step s needs no iterator state beyond s itself. Each host reads
only its own rows of every global batch; masking runs on the fly with a key
per record (static masking) or per (record, epoch) (dynamic masking); the
host-local arrays are assembled into global `jax.Array`s sharded over the
mesh's data axes; a thread pool prepares the next batches while the current
one trains.

The data directory is local or `gs://` (`albert_jax.storage`). Shards in
Cloud Storage are read where they are, not copied: ArrayRecord's reader
(array_record 0.8, under grain's `ArrayRecordDataSource`) opens `gs://`
names itself, through the google-cloud-cpp client built into it, one ranged
read per record. That client takes an emulator from
`CLOUD_STORAGE_EMULATOR_ENDPOINT`, which `albert_jax.storage` maps
`STORAGE_EMULATOR_HOST` onto. It reports a missing object as an empty file, so every listed shard is
checked to exist and the record count against `dataset.json` first.

That client keeps its own retries, which Python cannot set (array_record
builds it with google-cloud-cpp's defaults: a request silent for 120 s is
retried, for up to 15 minutes, with waits of 1 s to 5 minutes). When it
gives up, or is refused, the shard is not damaged: that is
`ShardReadError`, which names the shard and says to run again, where a
damaged shard says to prepare the data again. So is a shard it cannot
open when the loader counts the records (that was a raw RuntimeError).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
from typing import Any, Iterator

import numpy as np

from albert_jax import storage
from albert_jax.data import instances as instances_lib
from albert_jax.data import masking
from albert_jax.data import row_random
from albert_jax.data.shards import ShardReadError
from albert_jax.data.shards import unserved
from albert_jax.data.prepare import FORMAT

METADATA = "dataset.json"
# What every batch the loader yields holds, in this order (`batch_schema`).
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask",
              "masked_positions", "masked_ids", "masked_weights",
              "sentence_labels")
# A packed batch's (rows of up to K instances) adds each instance's [CLS].
PACKED_KEYS = BATCH_KEYS + ("cls_positions",)


def batch_schema(batch_size: int, seq_len: int, num_predictions: int,
                 max_per_row: int = 0
                 ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """A batch of `batch_size` rows: key → (shape, dtype).

  input_ids, token_type_ids, attention_mask [B, T] int32;
  masked_positions, masked_ids [B, P] int32; masked_weights [B, P] float32
  (P = 0 for unmasked batches); sentence_labels [B] int32 (-1 where the
  objective has none).

  Packed (`max_per_row` = K >= 1): attention_mask holds k + 1 on the
  tokens of the row's k-th instance (0 = padding); sentence_labels and
  cls_positions are [B, K], the label (-1 for an unused slot) and the
  [CLS] position of each instance.
  """
  b, t, p = batch_size, seq_len, num_predictions
  shapes = {"input_ids": (b, t), "token_type_ids": (b, t),
            "attention_mask": (b, t), "masked_positions": (b, p),
            "masked_ids": (b, p), "masked_weights": (b, p),
            "sentence_labels": (b, max_per_row) if max_per_row else (b,),
            "cls_positions": (b, max_per_row)}
  keys = PACKED_KEYS if max_per_row else BATCH_KEYS
  return {k: (shapes[k], np.dtype(np.float32 if k == "masked_weights"
                                  else np.int32)) for k in keys}


def max_per_row(metadata: dict[str, Any]) -> int:
  """K of a prepared dataset whose records are packed rows, else 0."""
  return int(metadata.get("config", {}).get("pack", 0))


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """What masking needs to know about the vocabulary.

  Attributes:
    word_start: [V] bool, pieces that start a word.
    special: [V] bool, pieces never masked.
    mask_id, pad_id: special ids.
  """
  word_start: np.ndarray
  special: np.ndarray
  mask_id: int
  pad_id: int

  @property
  def size(self) -> int:
    return len(self.word_start)

  @classmethod
  def from_tokenizer(cls, tokenizer) -> "Vocabulary":
    size = tokenizer.vocab_size
    special = np.zeros(size, bool)
    for i in (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id,
              tokenizer.mask_id):
      if i is None:
        raise ValueError(
            "Masked-LM data needs [CLS], [SEP], [MASK] and padding ids; this "
            "tokenizer lacks one. Train one with albert_jax.text.train_tokenizer, which adds "
            "them.")
      special[i] = True
    return cls(word_start=np.asarray(tokenizer.is_word_start(
        np.arange(size)), bool), special=special, mask_id=tokenizer.mask_id,
               pad_id=tokenizer.pad_id)


def read_metadata(data_dir: str) -> dict[str, Any]:
  """`dataset.json` of a prepared directory (local or `gs://`), checked
  for its format."""
  path = storage.path(data_dir) / METADATA
  if not path.is_file():
    raise FileNotFoundError(
        f"{data_dir} has no {METADATA} (missing, or its preparation did not "
        "finish); create it with `python -m albert_jax.data.prepare`.")
  fix = (f"prepare the data again: delete {data_dir} and rerun (a run "
         "prepares its workdir's data/ itself), or run `python -m "
         "albert_jax.data.prepare` into it.")
  metadata = storage.read_json_object(path, fix)
  if metadata.get("format") != FORMAT:
    raise ValueError(f"{path} has format {metadata.get('format')!r}, not "
                     f"{FORMAT!r}; prepare the data again.")
  splits = metadata.get("splits")
  if not isinstance(splits, dict) or not all(
      isinstance(s, dict) and isinstance(s.get("files"), list) and all(
          _plain_name(f) for f in s["files"]) for s in splits.values()):
    raise storage.DamagedFileError(
        f"{path} is damaged (its \"splits\" are not lists of shard file "
        f"names inside {data_dir}); {fix}")
  return metadata


def _plain_name(name) -> bool:
  """Whether `name` names a file in the directory itself: shards listed in
  dataset.json are read from there, never from a path it would lead to."""
  return (isinstance(name, str) and name not in ("", ".", "..")
          and "/" not in name and "\\" not in name)


def record_files(data_dir: str, metadata: dict[str, Any], split: str
                 ) -> list[str]:
  """The split's shard paths, as listed in the metadata (not a glob, so a
  stray file from another run cannot join the dataset)."""
  splits = metadata["splits"]
  if split not in splits or not splits[split]["files"]:
    raise FileNotFoundError(
        f"{data_dir} has no {split!r} shards (splits with data: "
        f"{[s for s in splits if splits[s]['files']]}).")
  directory = storage.path(data_dir)
  files = [os.fspath(directory / f) for f in splits[split]["files"]]
  # One listing rather than a request per shard.
  present = {p.name for p in directory.iterdir()}
  missing = [f for f, name in zip(files, splits[split]["files"])
             if name not in present]
  if missing:
    raise FileNotFoundError(f"{len(missing)} shard(s) listed in {data_dir}/"
                            f"{METADATA} are missing, e.g. {missing[0]}.")
  return files


class DamagedShardError(ValueError):
  """A prepared shard that cannot be read back (truncated or corrupted)."""


_DAMAGED_FIX = ("Prepare the data again (python -m albert_jax.data.prepare) "
                "into a new --output_dir, or restore the file from a copy.")


def step_positions(step: int, global_batch_size: int,
                   rows: slice | None = None) -> np.ndarray:
  """The positions global step `step` takes in the endless stream of
  epochs (epoch after epoch, each its own order of the items): s·B …
  s·B+B−1, B = `global_batch_size`, or the host's `rows` of them; [b]
  int64. Position p is in epoch p // N (N items an epoch, or a packed
  epoch's rows).

  Every step-indexed batch source reads its steps through this (the
  pre-training `Loader`, fine-tuning's `ArrayBatches` and `PackedBatches`),
  each with its own order of an epoch, so a batch is a function of (seed,
  step) alone and a resumed run takes exactly the batches an unbroken run
  would have.

  Raises:
    ValueError: a negative step.
  """
  if step < 0:
    raise ValueError(f"step must be >= 0, got {step}.")
  rows = slice(0, global_batch_size) if rows is None else rows
  return step * global_batch_size + np.arange(rows.start, rows.stop,
                                              dtype=np.int64)


class Loader:
  """Masked pre-training batches for one host.

  Position p of the endless record stream is record `order[p]`, where
  `order` is grain's index shuffle over all records, reshuffled each epoch
  (epoch = p // num_records). Global step s covers positions
  [s·G, (s+1)·G), G = global_batch_size; host h of H takes the h-th
  contiguous G/H of them, so hosts read disjoint rows and together exactly
  the single-host batch. A record of packed data (prepared with `pack`) is
  a row of up to K instances (`batch_schema` with K).

  Args:
    data_dir: output of `albert_jax.data.prepare`, local or `gs://`.
    split: "train" or "eval".
    global_batch_size: rows per step across all hosts.
    vocab: the tokenizer's `Vocabulary`.
    seed: shuffle and masking seed.
    masking_config: MLM recipe; None gives unmasked batches (causal LM),
      whose `masked_*` arrays have no columns ([b, 0]).
    dynamic_masking: fresh masks every epoch (RoBERTa) instead of one fixed
      mask per instance (static, as materialised data would have).
    process_index, process_count: this host's place (default: jax's).
    sharding: a `jax.sharding.Sharding` for [batch, ...] arrays (see
      `data_sharding`); None yields host-local NumPy batches.
    prefetch: batches prepared ahead in background threads (0: none).
  """

  def __init__(self, data_dir: str, split: str = "train", *,
               global_batch_size: int, vocab: Vocabulary, seed: int = 0,
               masking_config: masking.MaskingConfig | None = (
                   masking.MaskingConfig()),
               dynamic_masking: bool = True, process_index: int | None = None,
               process_count: int | None = None, sharding=None,
               prefetch: int = 2):
    import grain  # pylint: disable=g-import-not-at-top
    if process_index is None or process_count is None:
      import jax  # pylint: disable=g-import-not-at-top
      process_index, process_count = jax.process_index(), jax.process_count()
    if global_batch_size < 1 or global_batch_size % process_count:
      raise ValueError(
          f"global batch {global_batch_size} is not divisible by the "
          f"{process_count} processes; choose a multiple of {process_count}.")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in "
                       f"[0, {process_count}).")
    self.metadata = read_metadata(data_dir)
    self.seq_len = int(self.metadata["max_seq_length"])
    self.max_per_row = max_per_row(self.metadata)
    if vocab.size != int(self.metadata["vocab_size"]):
      raise ValueError(
          f"The data in {data_dir} was tokenised with a vocabulary of "
          f"{self.metadata['vocab_size']} pieces ({self.metadata['tokenizer']})"
          f" but this tokenizer has {vocab.size}; prepare the data with the "
          "tokenizer you train with.")
    self.files = record_files(data_dir, self.metadata, split)
    try:  # opens every shard, to count its records
      self._source = grain.sources.ArrayRecordDataSource(self.files)
    except Exception as e:  # pylint: disable=broad-except
      message = unserved(self.files, e)
      if message:
        raise ShardReadError(message) from e
      raise
    self.num_records = len(self._source)
    counts = self.metadata["splits"][split]
    expected = int(counts.get("rows", counts["instances"]))
    if self.num_records == 0:
      raise ValueError(f"{data_dir} holds no {split} instances.")
    if self.num_records != expected:
      raise ValueError(f"{data_dir} {split} shards hold {self.num_records} "
                       f"records but {METADATA} says {expected}; prepare the "
                       "data again.")
    # Record ids in shuffled order; grain derives each epoch's permutation
    # from (seed, epoch), in O(1) memory, so any position is random access.
    self._order = (grain.MapDataset.range(self.num_records)
                   .shuffle(seed=seed).repeat())
    self.global_batch_size = global_batch_size
    self.local_batch_size = global_batch_size // process_count
    self._first_row = process_index * self.local_batch_size
    if sharding is not None:
      # The rows this process's devices hold; equal to the even split unless
      # a model axis spans processes, where several processes hold the same
      # rows and must load the same records.
      from albert_jax import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
      rows = sharding_lib.process_batch_rows(sharding, global_batch_size)
      self._first_row = rows.start
      self.local_batch_size = rows.stop - rows.start
    self.process_index = process_index
    self.process_count = process_count
    self.vocab = vocab
    self.seed = seed
    self.masking_config = masking_config
    self.dynamic_masking = dynamic_masking
    self.sharding = sharding
    self.prefetch = max(0, prefetch)

  @property
  def num_predictions(self) -> int:
    """Masked slots per row (0 unmasked): max_predictions, or a packed
    row's `masking.packed_predictions`."""
    if self.masking_config is None:
      return 0
    if self.max_per_row:
      return masking.packed_predictions(self.masking_config, self.seq_len,
                                        self.max_per_row)
    return self.masking_config.max_predictions

  @property
  def steps_per_epoch(self) -> float:
    return self.num_records / self.global_batch_size

  def record_indices(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """This host's (record ids, epochs) of global step `step`, each [b]."""
    positions = step_positions(
        step, self.global_batch_size,
        slice(self._first_row, self._first_row + self.local_batch_size))
    records = np.array([self._order[int(p)] for p in positions], np.int64)
    return records, positions // self.num_records

  def local_batch(self, step: int) -> dict[str, np.ndarray]:
    """This host's rows of global step `step` as NumPy arrays.

    Returns the dict `batch_schema(b, T, P)` describes (P = 0 without a
    masking config).
    """
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    b, t = self.local_batch_size, self.seq_len
    records, epochs = self.record_indices(step)
    ids = np.full((b, t), self.vocab.pad_id, np.int32)
    types = np.zeros((b, t), np.int32)
    attention = np.zeros((b, t), np.int32)
    labels = np.zeros(b, np.int32)
    try:
      raw = self._source.__getitems__(records.tolist())
    except Exception as e:  # pylint: disable=broad-except
      message = unserved(self.files, e)
      if message:
        raise ShardReadError(message) from e
      raise DamagedShardError(self._damaged(records.tolist(), e)) from e
    if self.max_per_row:
      return self._packed_batch(records, epochs, raw)
    for row, (index, record) in enumerate(zip(records, raw)):
      try:
        instance = instances_lib.from_bytes(record)
      except ValueError as e:
        raise DamagedShardError(self._damaged_record(
            int(index), f"is not an instance ({e})")) from None
      n = len(instance.tokens)
      if n > t:
        raise ValueError(f"Record {index} has {n} tokens, more than the "
                         f"dataset's max_seq_length {t}.")
      if n and not 0 <= instance.tokens.min() <= instance.tokens.max() < (
          self.vocab.size):
        bad = int(instance.tokens.max() if instance.tokens.max()
                  >= self.vocab.size else instance.tokens.min())
        raise DamagedShardError(self._damaged_record(
            int(index), f"holds token id {bad}, outside the vocabulary's "
            f"{self.vocab.size} ids (the data was prepared with another "
            "tokenizer, or is damaged)"))
      ids[row, :n] = instance.tokens
      types[row, :n] = instance.token_type_ids
      attention[row, :n] = 1
      labels[row] = instance.label
    if self.masking_config is None:
      none = np.zeros((b, 0), np.int32)
      return {"input_ids": ids, "token_type_ids": types,
              "attention_mask": attention, "masked_positions": none,
              "masked_ids": none, "masked_weights": none.astype(np.float32),
              "sentence_labels": labels}
    # The masking key depends on the record (and the epoch when dynamic),
    # never on the batch: static masking gives a record one mask forever,
    # and any step can be recomputed on its own.
    keys = row_random.row_keys(
        self.seed, epochs if self.dynamic_masking else 0, records)
    masked = masking.mask_batch(
        ids, attention, keys, word_start=self.vocab.word_start,
        special=self.vocab.special, mask_id=self.vocab.mask_id,
        vocab_size=self.vocab.size, config=self.masking_config)
    return {
        "input_ids": masked["input_ids"].astype(np.int32),
        "token_type_ids": types,
        "attention_mask": attention,
        "masked_positions": masked["masked_positions"],
        "masked_ids": masked["masked_ids"],
        "masked_weights": masked["masked_weights"],
        "sentence_labels": labels,
    }

  def _packed_batch(self, records: np.ndarray, epochs: np.ndarray,
                    raw: list[bytes]) -> dict[str, np.ndarray]:
    """The batch of packed rows `records` (`batch_schema` with K).

    Each instance is masked as if it were a row of its own (its own budget,
    as the official code scales it by the instance's length, and its own
    key from (record, slot)), then its tokens and targets are moved to its
    offset in the packed row.
    """
    b, t, k = self.local_batch_size, self.seq_len, self.max_per_row
    ids = np.full((b, t), self.vocab.pad_id, np.int32)
    types = np.zeros((b, t), np.int32)
    attention = np.zeros((b, t), np.int32)
    cls = np.zeros((b, k), np.int32)
    labels = np.full((b, k), -1, np.int32)
    inst_row, inst_slot, inst_start, inst_len = [], [], [], []
    for row, (index, record) in enumerate(zip(records, raw)):
      row_instances = instances_lib.from_bytes_packed(record)
      if len(row_instances) > k:
        raise ValueError(f"Record {index} packs {len(row_instances)} "
                         f"instances, more than the dataset's {k} per row.")
      at = 0
      for slot, instance in enumerate(row_instances):
        n = len(instance.tokens)
        if at + n > t:
          raise ValueError(f"Record {index} packs more tokens than the "
                           f"dataset's max_seq_length {t}.")
        ids[row, at:at + n] = instance.tokens
        types[row, at:at + n] = instance.token_type_ids
        attention[row, at:at + n] = slot + 1
        cls[row, slot] = at
        labels[row, slot] = instance.label
        inst_row.append(row)
        inst_slot.append(slot)
        inst_start.append(at)
        inst_len.append(n)
        at += n
    out = {"input_ids": ids, "token_type_ids": types,
           "attention_mask": attention, "sentence_labels": labels,
           "cls_positions": cls}
    p = self.num_predictions
    if self.masking_config is None:
      none = np.zeros((b, 0), np.int32)
      return {**out, "masked_positions": none, "masked_ids": none,
              "masked_weights": none.astype(np.float32)}
    inst_row, inst_slot, inst_start, inst_len = (
        np.asarray(x, np.int64) for x in (inst_row, inst_slot, inst_start,
                                           inst_len))
    # The instances one per row, left-aligned: [N, T].
    j = np.arange(t)
    valid = j[None, :] < inst_len[:, None]
    src = np.minimum(inst_start[:, None] + j[None, :], t - 1)
    one_per_row = np.where(valid, ids[inst_row[:, None], src],
                           self.vocab.pad_id)
    keys = row_random.row_keys(
        self.seed, epochs[inst_row] if self.dynamic_masking else 0,
        records[inst_row] * k + inst_slot)
    masked = masking.mask_batch(
        one_per_row, valid.astype(np.int32), keys,
        word_start=self.vocab.word_start, special=self.vocab.special,
        mask_id=self.vocab.mask_id, vocab_size=self.vocab.size,
        config=self.masking_config)
    r, c = np.nonzero(valid)
    ids[inst_row[r], inst_start[r] + c] = masked["input_ids"][r, c]
    # Targets in instance order (so ascending positions within a row).
    inst, slot = np.nonzero(masked["masked_weights"] > 0)
    positions, targets, weights = masking._pack_targets(  # pylint: disable=protected-access
        inst_row[inst], masked["masked_positions"][inst, slot]
        + inst_start[inst], masked["masked_ids"][inst, slot], b, p)
    return {**out, "masked_positions": positions, "masked_ids": targets,
            "masked_weights": weights}

  def _damaged(self, records: list[int], error: Exception) -> str:
    """The message for a failed read of `records`: which shard, which
    record, and the fix (the reader's own error names neither)."""
    where = "one of " + ", ".join(self.files)
    for index in records:
      try:
        self._source[index]
      except Exception:  # pylint: disable=broad-except
        where = self._where(index)
        break
    brief = str(error).strip().splitlines()[0][:200] if str(error) else type(
        error).__name__
    return (f"Prepared data is damaged: {where} cannot be read ({brief}). "
            + _DAMAGED_FIX)

  def _damaged_record(self, index: int, what: str) -> str:
    """The message for a record that reads but holds no valid instance."""
    return f"Prepared data is damaged: {self._where(index)} {what}. " + (
        _DAMAGED_FIX)

  def _where(self, index: int) -> str:
    """"SHARD (record N)", or the shards when grain's map cannot say."""
    try:  # grain's record → (shard, position) map
      shard, _ = self._source._reader_idx_and_position(index)  # pylint: disable=protected-access
      return f"{self.files[shard]} (record {index})"
    except Exception:  # pylint: disable=broad-except
      return f"record {index} of " + ", ".join(self.files)

  def batch(self, step: int):
    """Global step `step`: global jax.Arrays if a sharding was given."""
    return self._place(self.local_batch(step))

  def iterate(self, start_step: int = 0, num_steps: int | None = None
              ) -> Iterator[tuple[int, Any]]:
    """Yields (step, batch) from `start_step` on, preparing batches ahead.

    Resuming is `iterate(start_step=s)`: step s's batch depends only on
    (seed, s), so the stream equals an uninterrupted run's from step s.
    """
    end = None if num_steps is None else start_step + num_steps
    step = start_step
    if self.prefetch == 0:
      while end is None or step < end:
        yield step, self.batch(step)
        step += 1
      return
    # Threads suffice: the record reads and NumPy masking release the GIL
    # for most of their time, and threads share the open shard readers.
    with concurrent.futures.ThreadPoolExecutor(self.prefetch) as pool:
      pending = collections.deque()
      try:
        while True:
          while len(pending) < self.prefetch and (end is None or step < end):
            pending.append((step, pool.submit(self.local_batch, step)))
            step += 1
          if not pending:
            return
          s, future = pending.popleft()
          yield s, self._place(future.result())
      finally:
        for _, future in pending:  # a consumer that stops early
          future.cancel()

  def _place(self, local: dict[str, np.ndarray]):
    if self.sharding is None:
      return local
    import jax  # pylint: disable=g-import-not-at-top
    return {k: jax.make_array_from_process_local_data(
        self.sharding, v, (self.global_batch_size,) + v.shape[1:])
            for k, v in local.items()}
