"""Corpora → documents (lists of sentences), streamed.

Three sources:
- `read_sentence_files`: the official ALBERT/BERT format, one sentence per
  line and a blank line between documents (`.gz` and globs allowed);
- `read_raw_files`: one document per file, or per line of a JSON-lines file
  (`field` names the text), split into sentences by `split_sentences`
  (files of both, and their globs, local or `gs://`: `albert_jax.storage`);
- `read_tfds`: any TFDS dataset by `name[/config][:feature]`, each host
  reading only its own contiguous slice of examples.

Dirty input never crashes a run: lines that are not UTF-8 (stray NUL bytes
included), lines over `MAX_LINE_BYTES`, unparsable JSON lines and non-text
values are counted in `ReadStats` and skipped, with a warning naming the
first few and a summary warning at the end (which names the iconv command
for a corpus in Latin-1). Only mistakes that would silently produce a wrong
corpus raise: a glob matching nothing, a JSON field that does not exist, and
a UTF-16 or UTF-32 file (by its byte-order mark, or the NUL bytes beside its
ASCII text), whose lines would otherwise be read as NUL-riddled "UTF-8"; the
error names the line, the byte and the iconv command that converts it
(`albert_jax.text.utf8`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import logging
import os
import re
from typing import IO, Iterator, Sequence
import zlib

from albert_jax import storage
from albert_jax.text import utf8

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 20
_MAX_WARNINGS = 5  # per-line warnings before going quiet (summary still)

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st gen col lt sgt capt gov sen rep rev jr sr vs etc "
    "e.g i.e u.s a.m p.m jan feb mar apr jun jul aug sep sept oct nov dec "
    "inc ltd co corp mt ft approx dept est".split())
# Abbreviations that are also common words: only one before a number.
_NUMBER_ABBREVIATIONS = frozenset("no nos fig figs vol p pp art sec ch".split())
_CLOSERS = "\"')]\u201d\u2019"
_OPENERS = "\"'([\u201c\u2018"
_SPLIT = re.compile(
    r"([.!?]+[\"'\u201d\u2019)\]]*)(\s+)(?=[\"'\u201c\u2018(\[]?([A-Z0-9]))")
_CJK_SPLIT = re.compile(r"(?<=[\u3002\uff01\uff1f])")
_LAST_WORD = re.compile(r"(\S+)$")
_WHITESPACE = re.compile(r"\s+")
_PARAGRAPH = re.compile(r"\n\s*\n")


@dataclasses.dataclass
class ReadStats:
  """Counters filled while a reader streams; shared with its consumer.

  `total_documents` is the number of documents the reader will visit when
  known in advance (TFDS), so progress can show an ETA; None otherwise.
  """
  files: int = 0
  documents: int = 0
  sentences: int = 0
  skipped_non_utf8: int = 0
  skipped_long_lines: int = 0
  skipped_records: int = 0
  skipped_files: int = 0
  total_files: int | None = None
  total_documents: int | None = None

  @property
  def skipped(self) -> int:
    return (self.skipped_non_utf8 + self.skipped_long_lines
            + self.skipped_records + self.skipped_files)

  def skip(self, kind: str, where: str, why: str) -> None:
    """Counts one skipped line/record; warns for the first few."""
    setattr(self, kind, getattr(self, kind) + 1)
    if self.skipped <= _MAX_WARNINGS:
      log.warning("Skipping %s: %s.%s", where, why,
                  " (Further skips are only counted.)"
                  if self.skipped == _MAX_WARNINGS else "")

  def warn_if_skipped(self) -> None:
    if self.skipped:
      log.warning(
          "Skipped %d line(s) that are not UTF-8, %d line(s) over %d bytes, "
          "%d unusable record(s) and the damaged end of %d file(s); the rest "
          "of the corpus was read.%s", self.skipped_non_utf8,
          self.skipped_long_lines, MAX_LINE_BYTES, self.skipped_records,
          self.skipped_files,
          " A corpus in Latin-1 or Windows-1252 loses every line with an "
          "accent this way: convert it first, e.g. iconv -f latin1 -t utf-8 "
          "IN > OUT." if self.skipped_non_utf8 else "")

  def count_document(self, sentences: list[str]) -> list[str]:
    """Counts a document a reader is about to yield; returns it."""
    self.documents += 1
    self.sentences += len(sentences)
    return sentences


# The corpus shipped with the package (albert_jax/data/bundled, with its
# provenance).
BUNDLED_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                           "bundled", "corpus")


def corpus_pattern(corpus: str) -> str:
  """"bundled" → the shipped corpus; anything else is a glob or TFDS spec."""
  if corpus == "bundled":
    return os.path.join(BUNDLED_DIR, "*.txt.gz")
  return corpus


def expand_paths(patterns: str | Sequence[str]) -> list[str]:
  """Expands globs (comma-separated or a list) into files, sorted per glob.

  Patterns are local (`~` expanded) or `gs://`; the files come back as
  strings of the same kind.

  Raises:
    FileNotFoundError: a pattern matches no file, naming the pattern.
  """
  if isinstance(patterns, str):
    patterns = [p.strip() for p in patterns.split(",") if p.strip()]
  if not patterns:
    raise FileNotFoundError("No input given: pass a file, glob or list.")
  paths: dict[str, None] = {}  # ordered set: overlapping globs read once
  for pattern in patterns:
    matched = [os.fspath(p) for p in storage.glob(pattern) if p.is_file()]
    if not matched:
      raise FileNotFoundError(f"No files match {pattern!r}.")
    paths.update(dict.fromkeys(matched))
  return list(paths)


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[bytes]]:
  """`path`'s bytes, decompressed for `.gz`, with `readline(limit)`."""
  with storage.path(path).open("rb") as raw:
    # Cloud Storage files (fsspec's) take no limit in readline; a buffered
    # reader over them does, and is a no-op cost for local ones.
    buffered = raw if isinstance(raw, io.BufferedIOBase) else (
        io.BufferedReader(raw, 1 << 20))
    if path.endswith(".gz"):
      with gzip.GzipFile(fileobj=buffered, mode="rb") as reader:
        yield reader
    else:
      yield buffered


def _lines(path: str, stats: ReadStats,
           max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
  """(line number, decoded line without newline); damaged lines skipped.

  Reads with a size cap so one gigabyte-long line cannot exhaust memory. A
  corrupt or truncated .gz ends its file with a warning, keeping the lines
  read before the damage. A line that is not UTF-8 is skipped and counted.

  Raises:
    EncodingError: the file is UTF-16 or UTF-32, naming the line, the byte
      and the iconv command that converts it.
  """
  decoder = utf8.LineDecoder(path)
  with _open(path) as reader:
    while True:
      try:
        raw = reader.readline(max_line_bytes + 1)
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
          size = len(raw)
          while raw and not raw.endswith(b"\n"):  # discard the rest
            raw = reader.readline(max_line_bytes + 1)
            size += len(raw)
          decoder.skip(size)
          stats.skip("skipped_long_lines", f"{path}:{decoder.number}",
                     f"line longer than {max_line_bytes} bytes")
          continue
      except (EOFError, OSError, zlib.error) as e:
        stats.skip("skipped_files", f"the rest of {path} after line "
                   f"{decoder.number}", f"unreadable ({e})")
        return
      if not raw:
        return
      try:
        line = decoder.decode(raw)
      except utf8.EncodingError as e:
        if not e.damaged_line:
          raise
        stats.skip("skipped_non_utf8", f"{path}:{decoder.number}",
                   e.reason)
        continue
      yield decoder.number, line.rstrip("\r\n")


def read_sentence_files(paths: Sequence[str], stats: ReadStats | None = None
                        ) -> Iterator[list[str]]:
  """Documents from files in the official format.

  Each document is a list of sentences (stripped, non-empty); blank lines
  separate documents, and a document never spans two files.
  """
  stats = stats if stats is not None else ReadStats()
  stats.total_files = len(paths)
  for path in paths:
    stats.files += 1
    document: list[str] = []
    for _, line in _lines(path, stats):
      line = line.strip()
      if line:
        document.append(line)
      elif document:
        yield stats.count_document(document)
        document = []
    if document:
      yield stats.count_document(document)
  stats.warn_if_skipped()


def split_sentences(text: str) -> list[str]:
  """Splits prose into sentences with a punctuation + capital-letter rule.

  Splits after `.`, `!` or `?` (and closing quotes/brackets) when whitespace
  and a capitalised word or digit follow (optionally after an opening quote
  or bracket), except after common abbreviations ("Dr.", "e.g."), number
  abbreviations before a digit ("No. 5") and single initials ("George W.
  Bush"); also after CJK full stops. Line breaks inside a paragraph are
  spaces; a blank line always ends a sentence. Sentences without a letter or
  digit are dropped.
  """
  sentences: list[str] = []
  for paragraph in _PARAGRAPH.split(text):
    paragraph = _WHITESPACE.sub(" ", paragraph).strip()
    if not paragraph:
      continue
    start = 0
    for m in _SPLIT.finditer(paragraph):
      head = paragraph[start:m.end(1)]
      word = _LAST_WORD.search(head)
      token = word.group(1).lower() if word else ""
      token = token.rstrip(".!?" + _CLOSERS).lstrip(_OPENERS)
      period = m.group(1).rstrip(_CLOSERS) == "."
      if period and (
          token in _ABBREVIATIONS or re.fullmatch(r"[a-z]", token) or
          (token in _NUMBER_ABBREVIATIONS and m.group(3).isdigit())):
        continue
      sentences.append(head.strip())
      start = m.end(2)
    sentences.extend(s.strip() for s in _CJK_SPLIT.split(paragraph[start:]))
  return [s for s in sentences if any(c.isalnum() for c in s)]


def read_raw_files(paths: Sequence[str], field: str | None = None,
                   stats: ReadStats | None = None) -> Iterator[list[str]]:
  """Documents from raw text: one per file, or one per JSON line's `field`.

  Raises:
    ValueError: a JSON object lacks `field` (naming file:line), which means
      the field name is wrong rather than the data dirty.
  """
  stats = stats if stats is not None else ReadStats()
  stats.total_files = len(paths)
  for path in paths:
    stats.files += 1
    if field is not None:
      texts = _jsonl_texts(path, field, stats)
    else:
      texts = iter(["\n".join(line for _, line in _lines(path, stats))])
    for text in texts:
      sentences = split_sentences(text)
      if sentences:
        yield stats.count_document(sentences)
  stats.warn_if_skipped()


def _jsonl_texts(path: str, field: str, stats: ReadStats) -> Iterator[str]:
  for number, line in _lines(path, stats):
    if not line.strip():
      continue
    where = f"{path}:{number}"
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      stats.skip("skipped_records", where, f"not valid JSON ({e.msg})")
      continue
    if not isinstance(record, dict):
      stats.skip("skipped_records", where,
                 f"a JSON {type(record).__name__}, not an object")
      continue
    if field not in record:
      raise ValueError(f"{where} has no field {field!r}; its fields are "
                       f"{sorted(record)}. Pass one of them as jsonl:FIELD.")
    text = record[field]
    if not isinstance(text, str):
      stats.skip("skipped_records", where,
                 f"field {field!r} is {type(text).__name__}, not text")
      continue
    bad = utf8.lone_surrogate(text)
    if bad:
      stats.skip("skipped_records", where, f"field {field!r}: {bad}")
      continue
    yield text


def parse_tfds_spec(spec: str) -> tuple[str, str]:
  """"wikipedia/20230601.en:text" → ("wikipedia/20230601.en", "text")."""
  name, _, feature = spec.partition(":")
  if not name:
    raise ValueError(f"TFDS spec {spec!r} has no dataset name; use name"
                     "[/config][:feature], e.g. wikipedia/20230601.en:text.")
  return name, feature or "text"


def host_range(num_examples: int, index: int, count: int) -> range:
  """The contiguous slice of examples host `index` of `count` reads.

  Slices partition range(num_examples) in order; sizes differ by at most 1.
  """
  if not 0 <= index < count:
    raise ValueError(f"process_index {index} not in [0, {count}).")
  per, extra = divmod(num_examples, count)
  start = index * per + min(index, extra)
  return range(start, start + per + (1 if index < extra else 0))


def read_tfds(spec: str, split: str = "train", *, process_index: int = 0,
              process_count: int = 1, data_dir: str | None = None,
              stats: ReadStats | None = None,
              examples: range | None = None) -> Iterator[list[str]]:
  """Documents from a TFDS dataset; this host reads only its own slice.

  Each example's text feature is split into sentences. Datasets stored as
  ArrayRecord are read by random access (`tfds.data_source`), touching only
  `host_range(...)`; others are read through `tfds.load` with an even
  sub-split per host. Either way the hosts' documents partition the split.
  `examples` (a step-1 range) reads exactly those examples instead.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  stats = stats if stats is not None else ReadStats()
  name, feature = parse_tfds_spec(spec)
  wanted = examples
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir)
  except NotImplementedError:  # no random access for this file format
    if wanted is not None:
      examples = _tfds_slice(tfds, name, split, data_dir, wanted, stats)
    else:
      examples = _tfds_sequential(tfds, name, split, data_dir, process_index,
                                  process_count, stats)
  else:
    indices = wanted if wanted is not None else host_range(
        len(source), process_index, process_count)
    stats.total_documents = len(indices)
    examples = (source[i] for i in indices)
  for number, example in enumerate(examples):
    if feature not in example:
      raise ValueError(f"TFDS {name} has no feature {feature!r}; its "
                       f"features are {sorted(example)}. Use {name}:FEATURE.")
    text = example[feature]
    if isinstance(text, bytes):
      try:
        text = text.decode("utf-8")
      except UnicodeDecodeError as e:
        stats.skip("skipped_non_utf8", f"{name}[{split}] example {number}",
                   f"not valid UTF-8 ({e.reason})")
        continue
    if not isinstance(text, str):
      stats.skip("skipped_records", f"{name}[{split}] example {number}",
                 f"feature {feature!r} is not text")
      continue
    sentences = split_sentences(text)
    if sentences:
      yield stats.count_document(sentences)
  stats.warn_if_skipped()


def _tfds_slice(tfds, name, split, data_dir, wanted, stats):
  """Examples [wanted.start, wanted.stop) via tf.data (TFRecord data)."""
  stats.total_documents = len(wanted)
  builder = tfds.builder(name, data_dir=data_dir)
  return tfds.as_numpy(builder.as_dataset(
      split=f"{split}[{wanted.start}:{wanted.stop}]", shuffle_files=False))


def _tfds_sequential(tfds, name, split, data_dir, index, count, stats):
  """Examples of this host's even sub-split via tf.data (TFRecord data)."""
  sub = tfds.even_splits(split, n=count)[index]
  builder = tfds.builder(name, data_dir=data_dir)
  try:
    stats.total_documents = builder.info.splits[sub].num_examples
  except (KeyError, ValueError):
    stats.total_documents = None
  return tfds.as_numpy(builder.as_dataset(split=sub, shuffle_files=False))
