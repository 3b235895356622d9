"""Documents → pre-training instances ([CLS] A [SEP] B [SEP] + sentence label).

Follows the official `create_instances_from_document`: a target length of
`max_seq_length - 3` (or, with probability `short_seq_prob`, a random shorter
one), sentences accumulated into a chunk until the target is reached, a random
split of the chunk into segments A and B, and `truncate_seq_pair` trimming the
longer side from a random end. Objectives:

- "sop" (ALBERT): label 1 = A and B swapped, with probability 0.5. Unlike the
  official code, a chunk holding a single sentence does not fall back to an
  NSP-style negative drawn from another document (albert #234): the chunk is
  extended with the next sentence instead, and a document's trailing lone
  sentence (or a one-sentence document) is skipped and counted. Set
  `nsp_negatives_in_sop=True` for the official behaviour.
- "nsp" (BERT): label 1 = B is taken from a random other document, with
  probability 0.5.
- "none" (RoBERTa FULL-SENTENCES): sentences packed contiguously up to
  `max_seq_length - 2` tokens, crossing document boundaries with an extra
  [SEP] between documents; label -1. With `exact_length=True` (GPT-1's
  contiguous windows) the stream is cut at exactly that many tokens, the
  cut falling inside a sentence where it must, so every instance but the
  last has no padding.

Every document gets its own random stream derived from (seed, duplicate,
document index), so the output does not depend on how documents are split
across worker processes.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Iterable, Iterator, Sequence

import numpy as np

OBJECTIVES = ("sop", "nsp", "none")
Document = Sequence[Sequence[int]]  # sentences of token ids


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
  max_seq_length: int = 512
  short_seq_prob: float = 0.1
  objective: str = "sop"
  nsp_negatives_in_sop: bool = False
  dupe_factor: int = 1
  exact_length: bool = False

  def __post_init__(self):
    if self.objective not in OBJECTIVES:
      raise ValueError(f"objective={self.objective!r}; choose one of "
                       f"{OBJECTIVES}.")
    if self.exact_length and self.objective != "none":
      raise ValueError(
          f"exact_length=True cuts one token stream into windows, which "
          f"has no sentence pairs; objective={self.objective!r} needs them. "
          "Set objective='none' (data.objective) or exact_length=False.")
    if self.max_seq_length < 5:
      raise ValueError("max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]).")
    if not 0.0 <= self.short_seq_prob <= 1.0:
      raise ValueError("short_seq_prob must be in [0, 1].")
    if self.dupe_factor < 1:
      raise ValueError("dupe_factor must be >= 1.")


@dataclasses.dataclass
class Instance:
  tokens: np.ndarray       # [n] int32, [CLS] A [SEP] B [SEP], unpadded
  token_type_ids: np.ndarray  # [n] int8, 0 for [CLS] A [SEP], 1 for B [SEP]
  label: int               # 1 = swapped / random next, 0 = in order, -1 none


@dataclasses.dataclass
class Stats:
  documents: int = 0
  sentences: int = 0
  instances: int = 0
  tokens: int = 0
  skipped_documents: int = 0
  skipped_chunks: int = 0
  rows: int = 0  # records written: instances, or packed rows of them

  def add(self, other: "Stats") -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def document_rng(seed: int, dupe: int, index: int) -> np.random.Generator:
  return np.random.default_rng([seed, dupe, index, 0xA1BE])


def truncate_seq_pair(a: list[int], b: list[int], max_tokens: int,
                      rng: np.random.Generator) -> None:
  """Trims the longer of a and b, one token at a time from a random end.

  The official loop removes one token per iteration (the longer side's,
  b's on a tie), drawing one uniform per token for its end. The same draws
  and the same choices are made here at once, so a megabyte-long sentence
  costs linear time rather than a list deletion per token.
  """
  excess = len(a) + len(b) - max_tokens
  if excess <= 0:
    return
  draws = rng.random(excess)  # the loop's draws, in its order
  gap = len(a) - len(b)
  first = min(abs(gap), excess)
  # The longer side alone until both are equal; then b, a, b, a, ...
  on_a = np.empty(excess, bool)
  on_a[:first] = gap > 0
  on_a[first:] = np.arange(excess - first) % 2 == 1
  from_front = draws < 0.5
  for side, mine in ((a, on_a), (b, ~on_a)):
    removed = int(np.count_nonzero(mine))
    front = int(np.count_nonzero(from_front & mine))
    del side[len(side) - (removed - front):]
    del side[:front]


def _pack(a: list[int], b: list[int], cls_id: int, sep_id: int,
          label: int) -> Instance:
  tokens = [cls_id] + a + [sep_id] + b + [sep_id]
  types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
  return Instance(np.asarray(tokens, np.int32), np.asarray(types, np.int8),
                  label)


def instances_from_document(
    documents: Sequence[Document], index: int, config: InstanceConfig,
    rng: np.random.Generator, cls_id: int, sep_id: int,
    stats: Stats) -> list[Instance]:
  """Instances for `documents[index]` under the "sop" or "nsp" objective.

  `documents` is the pool random-next segments are drawn from (the official
  code uses the whole corpus; a streaming run uses a window around `index`).
  """
  document = documents[index]
  max_tokens = config.max_seq_length - 3
  target = max_tokens
  if rng.random() < config.short_seq_prob:
    target = int(rng.integers(2, max_tokens + 1))
  nsp = config.objective == "nsp"
  official_sop = config.objective == "sop" and config.nsp_negatives_in_sop
  out: list[Instance] = []
  chunk: list[Sequence[int]] = []
  length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    length += len(document[i])
    last = i == len(document) - 1
    # Our SOP needs two segments to order; keep accumulating until it has.
    wants_more = (config.objective == "sop" and not official_sop
                  and len(chunk) < 2)
    if last or (length >= target and not wants_more):
      a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
      a = [t for s in chunk[:a_end] for t in s]
      b: list[int] = []
      label = 0
      if len(chunk) == 1 or (nsp and rng.random() < 0.5):
        if config.objective == "sop" and not official_sop:
          stats.skipped_chunks += 1
          chunk, length = [], 0
          i += 1
          continue
        label = 1
        b = _random_segment(documents, index, target - len(a), rng)
        # Sentences not used for A go back to the document.
        i -= len(chunk) - a_end
        if not b:
          stats.skipped_chunks += 1
          chunk, length = [], 0
          i += 1
          continue
      elif not nsp and rng.random() < 0.5:
        label = 1
        b = [t for s in chunk[a_end:] for t in s]
        a, b = b, a
      else:
        b = [t for s in chunk[a_end:] for t in s]
      truncate_seq_pair(a, b, max_tokens, rng)
      if a and b:
        out.append(_pack(a, b, cls_id, sep_id, label))
      else:
        stats.skipped_chunks += 1
      chunk, length = [], 0
    i += 1
  return out


def _random_segment(documents, index, target_b_length, rng) -> list[int]:
  """Tokens from a random other document, starting at a random sentence."""
  if len(documents) < 2:
    return []
  for _ in range(10):
    other = int(rng.integers(0, len(documents)))
    if other != index:
      break
  else:
    return []
  doc = documents[other]
  if not doc:
    return []
  start = int(rng.integers(0, len(doc)))
  b: list[int] = []
  for sentence in doc[start:]:
    b.extend(sentence)
    if len(b) >= target_b_length:
      break
  return b


def pack_full_sentences(documents: Iterable[Document], config: InstanceConfig,
                        cls_id: int, sep_id: int, stats: Stats
                        ) -> Iterator[Instance]:
  """RoBERTa FULL-SENTENCES: [CLS] s1 s2 ... [SEP], crossing documents with an
  extra [SEP] between them. Sentences longer than the budget are split.

  With `config.exact_length` (GPT-1) a sentence that does not fit fills the
  instance to exactly `max_seq_length` tokens and goes on in the next one.
  """
  del stats  # nothing is skipped here
  budget = config.max_seq_length - 2
  current: list[int] = []

  def flush():
    tokens = [cls_id] + current + [sep_id]
    return Instance(np.asarray(tokens, np.int32),
                    np.zeros(len(tokens), np.int8), -1)

  for document in documents:
    # The boundary [SEP] is placed with the document's first token, and only
    # if that token shares an instance with the previous document: a [SEP]
    # appended eagerly would end an instance "... [SEP] [SEP]" whenever the
    # next sentence did not fit, and double up around empty documents.
    boundary = bool(current)
    for sentence in document:
      sentence = list(sentence)
      while sentence:
        sep = [sep_id] if boundary and current else []
        room = budget - len(current)
        if config.exact_length:
          # The boundary [SEP] takes a slot like any token of the stream
          # (so a row may end "... [SEP] [SEP]"), and one that would open a
          # row is left out, as it is without exact_length.
          if room == 0:
            yield flush()
            current = []
            continue
          current.extend(sep)
          boundary = False
          room -= len(sep)
        else:
          room -= len(sep)
          if len(sentence) > room and current:
            yield flush()
            current = []
            continue
          current.extend(sep)
          boundary = False
        # The whole sentence when it fits; otherwise (an empty row, or
        # exact_length) as much as the room holds, the rest in the next row.
        current.extend(sentence[:room])
        sentence = sentence[room:]
  if current:
    yield flush()


def create_instances(documents: Sequence[Document], config: InstanceConfig,
                     seed: int, cls_id: int, sep_id: int,
                     first_index: int = 0) -> tuple[list[Instance], Stats]:
  """Instances for a block of documents (all duplicates), and counts.

  Args:
    documents: sentences of token ids per document; also the pool for
      random-next segments.
    config: the instance recipe.
    seed: corpus-level seed.
    cls_id, sep_id: special token ids.
    first_index: global index of documents[0], so per-document random streams
      are the same however the corpus is split into blocks.
  """
  stats = Stats()
  stats.documents = len(documents)
  stats.sentences = sum(len(d) for d in documents)
  out: list[Instance] = []
  if config.objective == "none":
    for dupe in range(config.dupe_factor):
      order = document_rng(seed, dupe, first_index).permutation(len(documents))
      out.extend(pack_full_sentences((documents[j] for j in order), config,
                                     cls_id, sep_id, stats))
  else:
    for dupe in range(config.dupe_factor):
      for j, document in enumerate(documents):
        if config.objective == "sop" and not config.nsp_negatives_in_sop and (
            len(document) < 2):
          if dupe == 0:
            stats.skipped_documents += 1
          continue
        rng = document_rng(seed, dupe, first_index + j)
        out.extend(instances_from_document(documents, j, config, rng, cls_id,
                                           sep_id, stats))
  stats.instances = stats.rows = len(out)
  stats.tokens = int(sum(len(x.tokens) for x in out))
  return out, stats


def pack_rows(lengths: Sequence[int], max_seq_length: int,
              max_per_row: int) -> list[list[int]]:
  """Groups instances into rows of at most `max_seq_length` tokens and
  `max_per_row` instances: best-fit decreasing (longest first, each into
  the open row it fills most tightly, else a new row).

  Args:
    lengths: [N] tokens per instance, each <= max_seq_length.
    max_seq_length: a row's length.
    max_per_row: K, the most instances a row holds (static, so the
      sentence head keeps a [B, K] shape).

  Returns:
    The rows, each the ascending indices of its instances, in the order of
    their first instance: deterministic for given lengths.
  """
  if max_per_row < 1:
    raise ValueError(f"max_per_row must be >= 1, got {max_per_row}.")
  if not len(lengths):
    return []
  smallest = min(lengths)
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable
  rows: list[list[int]] = []
  # Open rows (room for one more instance) by their free tokens; a sorted
  # list of the distinct free counts finds the tightest fit in O(log T).
  by_room: dict[int, list[int]] = {}
  rooms: list[int] = []
  for i in order:
    n = lengths[i]
    if n > max_seq_length:
      raise ValueError(f"Instance {i} has {n} tokens, more than "
                       f"max_seq_length {max_seq_length}.")
    j = bisect.bisect_left(rooms, n)
    if j < len(rooms):
      room = rooms[j]
      row = by_room[room].pop()
      if not by_room[room]:
        del by_room[room]
        rooms.pop(j)
    else:
      room, row = max_seq_length, len(rows)
      rows.append([])
    rows[row].append(i)
    room -= n
    if len(rows[row]) < max_per_row and room >= smallest:
      if room not in by_room:
        by_room[room] = []
        bisect.insort(rooms, room)
      by_room[room].append(row)
  for row in rows:
    row.sort()
  rows.sort(key=lambda r: r[0])
  return rows


def rows_per_step(batch_size: int, num_items: int, num_rows: int,
                  multiple: int = 1) -> int:
  """Packed rows a training step takes to hold `batch_size` items (a
  pre-training run's instances, a fine-tune's examples).

  `num_items` items were packed into `num_rows` rows; a step takes
  round(batch_size / (items per row)) rows, rounded up to a multiple of
  `multiple` (data-parallel size × accumulation steps), at least one.
  Rows are shuffled, so a step's items vary around `batch_size`; over an
  epoch they average out to it.
  """
  per_row = num_items / num_rows
  rows = max(1, round(batch_size / per_row))
  return -(-rows // multiple) * multiple


# On-disk record: label (int8), then tokens (int32) and token types (int8).
_HEADER = np.dtype([("label", "<i1"), ("length", "<u4")])


def to_bytes(instance: Instance) -> bytes:
  """Serialises an instance for a record file (no pickle)."""
  n = len(instance.tokens)
  header = np.array([(instance.label, n)], _HEADER)
  return (header.tobytes() + instance.tokens.astype("<i4").tobytes()
          + instance.token_type_ids.astype("<i1").tobytes())


def to_bytes_packed(row: Sequence[Instance]) -> bytes:
  """A packed row's record: the instance count (uint8), then each
  instance as `to_bytes` writes it."""
  return np.uint8(len(row)).tobytes() + b"".join(map(to_bytes, row))


def from_bytes_packed(record: bytes) -> list[Instance]:
  """Inverse of `to_bytes_packed`; raises ValueError on a malformed
  record."""
  if not record:
    raise ValueError("Truncated packed record.")
  count, at, out = record[0], 1, []
  hs = _HEADER.itemsize
  for _ in range(count):
    if len(record) < at + hs:
      raise ValueError("Truncated packed record.")
    n = int(np.frombuffer(record[at:at + hs], _HEADER)[0]["length"])
    out.append(from_bytes(record[at:at + hs + 5 * n]))
    at += hs + 5 * n
  if at != len(record):
    raise ValueError(f"Packed record of {len(record)} bytes holds "
                     f"{len(record) - at} bytes after its {count} instances.")
  return out


def from_bytes(record: bytes) -> Instance:
  """Inverse of `to_bytes`; raises ValueError on a malformed record."""
  hs = _HEADER.itemsize
  if len(record) < hs:
    raise ValueError("Truncated instance record.")
  header = np.frombuffer(record[:hs], _HEADER)[0]
  n = int(header["length"])
  if len(record) != hs + 5 * n:
    raise ValueError(f"Instance record of {len(record)} bytes does not match "
                     f"its declared length {n}.")
  tokens = np.frombuffer(record[hs:hs + 4 * n], "<i4").astype(np.int32)
  types = np.frombuffer(record[hs + 4 * n:], "<i1").astype(np.int8)
  return Instance(tokens, types, int(header["label"]))
