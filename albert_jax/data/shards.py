"""The corpus in blocks, and each block's shard written by a worker.

`document_blocks` cuts one unit of work's document stream
(`albert_jax.data.units`) into blocks of at most `docs_per_block` documents
(fewer when they hold over 32M characters), per split, in the reading
process, repeating or dropping documents by the unit's mixture weight;
`write_block` tokenises one block, makes its instances and writes its
ArrayRecord shard, in a worker process (or in process, `InProcess`, for one
worker). Document d's randomness depends only on (seed, dupe, d), with d
counted from the unit's first index, so the shards are byte-identical for
any number of workers and of hosts. A worker dies with the process that
started it (`init_worker`), so a killed prepare leaves no writer behind.
`albert_jax.data.prepare` drives them.

Reading a shard back on gs:// can fail without the shard being damaged:
`unserved` tells a read Cloud Storage did not serve (ArrayRecord's reader
refused, or out of its own retries) by the error's text, and
`ShardReadError` carries its one line (the loader's batches, prepare's
check of finished shards).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
from typing import Iterator, TextIO

from albert_jax import storage
from albert_jax.text import documents as documents_lib
from albert_jax.data import instances as instances_lib

SPLITS = ("train", "eval")
_MAX_BLOCK_CHARS = 1 << 25  # bounds a block's memory when documents are huge
_TOKENIZER = None  # one per worker process, loaded by init_worker


class ShardReadError(OSError):
  """A `gs://` shard that Cloud Storage did not serve to ArrayRecord's
  reader (an outage longer than the reader's own retries, or a refusal):
  the data is not known to be damaged."""


# google-cloud-cpp's words, in the error riegeli's GcsReader passes on, when
# the client inside ArrayRecord's reader gives up on a request: after its
# retries of transient failures, or at once on a permanent one (401, 403,
# 404).
_GCS_GAVE_UP = re.compile(r"Retry policy exhausted|Permanent error")
_GCS_RETRIES = ("ArrayRecord's reader retries in its own client "
                "(google-cloud-cpp: a request silent for 120 s is retried, "
                "for up to 15 minutes), which albert_jax cannot set")


def _bucket_of(files: list[str]) -> str:
  """`gs://BUCKET` of the first remote shard."""
  remote = next(f for f in files if storage.is_remote(f))
  return "gs://" + remote[len("gs://"):].split("/", 1)[0]


def unserved(files: list[str], error: Exception) -> str | None:
  """The message for a failed read of `files` that Cloud Storage caused
  (the client in ArrayRecord's reader gave up, or was refused), else None.
  Decided from the error alone: each record read again could take the
  reader's 15 minutes of retries."""
  text = str(error).strip()
  if not (_GCS_GAVE_UP.search(text)
          and any(storage.is_remote(f) for f in files)):
    return None
  found = re.search(r"reading (gs://\S+?);", text)
  shard = found.group(1) if found else _bucket_of(files)
  brief = text.splitlines()[0][:300]
  if text.startswith("Retry policy exhausted"):
    what = ("Cloud Storage did not answer ArrayRecord's reader, which gave "
            "up after its own retries")
  else:
    what = "Cloud Storage refused ArrayRecord's reader"
  return (f"Reading prepared data from {shard} failed: {what} ({brief}). "
          "The shard is not known to be damaged. Check the network, the "
          "bucket's permissions and that the shard is there (gcloud storage "
          f"ls {shard}), then run again (a training run resumes from its "
          f"last checkpoint). {_GCS_RETRIES}.")



def is_eval_document(index: int, fraction: float) -> bool:
  """Deterministic held-out choice by document index."""
  if fraction <= 0:
    return False
  digest = hashlib.sha256(f"doc{index}".encode()).digest()
  return int.from_bytes(digest[:8], "little") / 2**64 < fraction


def copies(index: int, weight: float, seed: int) -> int:
  """How many times a mixture source of `weight` takes document `index`:
  floor(weight), plus one with probability frac(weight), by a hash of
  (seed, index), so the choice is deterministic and the expected count is
  `weight` (upsampling by repetition, downsampling by dropping)."""
  whole = math.floor(weight)
  frac = weight - whole
  if frac <= 0:
    return whole
  digest = hashlib.sha256(f"mix{seed}:{index}".encode()).digest()
  return whole + (int.from_bytes(digest[:8], "little") / 2**64 < frac)


def die_with_parent(parent_pid: int) -> None:
  """Ends this process when `parent_pid` ends, however it ends (SIGKILL too).

  Linux's parent-death signal does it in the kernel; elsewhere a thread
  polls the parent id. Either way a worker never outlives the prepare that
  started it and goes on writing shards into a directory a rerun now owns.
  """
  if sys.platform.startswith("linux"):
    try:
      libc = ctypes.CDLL(None, use_errno=True)
      pr_set_pdeathsig = 1
      if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) == 0:
        # The parent may have died before the call: then nobody would
        # send the signal, and this process has been re-parented already.
        if os.getppid() != parent_pid:
          os._exit(1)  # pylint: disable=protected-access
        return
    except (OSError, AttributeError):
      pass

  def watch():
    while os.getppid() == parent_pid:
      time.sleep(0.5)
    os._exit(1)  # pylint: disable=protected-access
  threading.Thread(target=watch, daemon=True).start()


def init_worker(tokenizer_path: str, parent_pid: int | None = None) -> None:
  """Loads the tokenizer `write_block` uses, once per worker process; with
  `parent_pid`, ties this worker's life to that process's."""
  global _TOKENIZER
  if parent_pid is not None:
    die_with_parent(parent_pid)
  from albert_jax.text.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  _TOKENIZER = Tokenizer.from_file(tokenizer_path)


def write_block(split: str, unit: int, block: int, first_index: int,
                docs: list[list[str]], output_dir: str,
                recipe: instances_lib.InstanceConfig, seed: int,
                pack: int = 0) -> tuple[str, instances_lib.Stats]:
  """Tokenises a block of documents and writes its shard (the unit's
  `block`-th of `split`) into `output_dir` (local or `gs://`) with the
  instance `recipe` and `seed`; returns (path, counts). With `pack` = K >= 2
  each record is a row of up to K instances (`instances.pack_rows` over the
  block), else one instance."""
  tok = _TOKENIZER
  # Sentences that tokenise to nothing (e.g. only control characters) would
  # make empty segments; drop them.
  tokenised = [[ids for ids in map(tok.encode, doc) if ids] for doc in docs]
  made, stats = instances_lib.create_instances(
      tokenised, recipe, seed, tok.cls_id, tok.sep_id,
      first_index=first_index)
  if pack:
    groups = instances_lib.pack_rows([len(x.tokens) for x in made],
                                     recipe.max_seq_length, pack)
    records = [instances_lib.to_bytes_packed([made[i] for i in g])
               for g in groups]
    stats.rows = len(groups)
  else:
    records = [instances_lib.to_bytes(x) for x in made]
  path = storage.path(output_dir) / shard_name(split, unit, block)
  if not storage.is_remote(path):
    tmp = f"{path}.tmp"
    _write_records(tmp, records)
    os.replace(tmp, path)  # a shard is either whole or absent
    return os.fspath(path), stats
  # ArrayRecord writes only local files: write one, then upload it in one
  # request, which makes the object appear whole or not at all.
  with tempfile.TemporaryDirectory(prefix="albert_jax_") as tmp:
    local = os.path.join(tmp, path.name)
    _write_records(local, records)
    with open(local, "rb") as f:
      storage.write_atomic(path, f.read())
  return os.fspath(path), stats


def _write_records(path: str, records: list[bytes]) -> None:
  """Writes `records` as the local ArrayRecord file `path`."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  # group_size:1 makes every record randomly accessible on its own, which
  # the loader's global shuffle needs.
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  for record in records:
    writer.write(record)
  writer.close()


def shard_name(split: str, unit: int, block: int) -> str:
  """The file name of a unit's block-th shard of a split."""
  return f"{split}-{unit:05d}-{block:05d}.arrayrecord"


def document_blocks(docs: Iterator[list[str]], eval_fraction: float,
                    docs_per_block: int, first_index: int = 0,
                    weight: float = 1.0, seed: int = 0
                    ) -> Iterator[tuple[str, int, int, list[list[str]]]]:
  """(split, block number, first document index in split, documents): at
  most `docs_per_block` documents a block.

  Input document i (counted from `first_index`) is held out for "eval" with
  probability `eval_fraction` (by its index), and taken `copies(i, weight,
  seed)` times, all copies in the same split (so no held-out text is
  trained on) and each with its own index, so its own random stream.
  """
  buffers = {s: [] for s in SPLITS}
  chars = {s: 0 for s in SPLITS}
  firsts = {s: 0 for s in SPLITS}
  counts = {s: 0 for s in SPLITS}
  seen = {s: first_index for s in SPLITS}
  for index, doc in enumerate(docs, first_index):
    split = "eval" if is_eval_document(index, eval_fraction) else "train"
    for _ in range(1 if weight == 1 else copies(index, weight, seed)):
      if not buffers[split]:
        firsts[split] = seen[split]
      buffers[split].append(doc)
      chars[split] += sum(map(len, doc))
      seen[split] += 1
      if (len(buffers[split]) >= docs_per_block
          or chars[split] >= _MAX_BLOCK_CHARS):
        yield split, counts[split], firsts[split], buffers[split]
        counts[split] += 1
        buffers[split], chars[split] = [], 0
  for split in SPLITS:
    if buffers[split]:
      yield split, counts[split], firsts[split], buffers[split]


class InProcess(concurrent.futures.Executor):
  """num_workers=1: run blocks here, skipping process start-up and pickling."""

  def submit(self, fn, /, *args, **kwargs):
    future = concurrent.futures.Future()
    future.set_result(fn(*args, **kwargs))
    return future


class Progress:
  """A one-line progress bar: documents, documents/s, instances, ETA."""

  def __init__(self, stream: TextIO | None,
               read_stats: documents_lib.ReadStats | None):
    self.stream, self.read_stats = stream, read_stats
    self.start = self.last = time.time()

  def update(self, documents: int, instances: int, final: bool = False):
    now = time.time()
    if self.stream is None or (not final and now - self.last < 0.5):
      return
    self.last = now
    rate = documents / max(now - self.start, 1e-9)
    text = (f"prepare: {documents:,} documents ({rate:,.0f}/s), "
            f"{instances:,} instances")
    rs = self.read_stats
    if rs is not None and rs.total_documents:
      frac = min(documents / rs.total_documents, 1.0)
      eta = (rs.total_documents - documents) / max(rate, 1e-9)
      text += f", {frac:.0%} of {rs.total_documents:,}, ETA {eta:,.0f}s"
    elif rs is not None and rs.total_files:
      text += f", file {rs.files}/{rs.total_files}"
    end = "\n" if final else ""
    print(f"\r{text}", end=end, file=self.stream, flush=True)
