"""Labelled data files: reading and writing TSV, CSV and JSONL tables.

Formats go by extension, each optionally gzipped (`.gz`):
  .tsv   a header row, then one row per line, fields split on TAB, no quoting
         (the GLUE convention: fields never hold TAB or newline).
  .csv   RFC 4180 (Excel) quoting; quoted fields may hold commas, quotes and
         newlines.
  .jsonl one JSON object per line.
Files are UTF-8 (a BOM is allowed; other encodings are refused with the
line, the byte and the iconv command that converts them:
`albert_jax.text.utf8`); blank lines are skipped. A row's index is
its 0-based position among the data rows (header and blank lines excluded).
Paths are local (`~` expanded) or `gs://BUCKET/...` (`albert_jax.storage`).

Cutting one file into stratified train/eval/test files is
`albert_jax.finetune.data_files.split_file`.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import gzip
import io
import json
import logging
import math
import os
from typing import Any, Mapping, Optional, Sequence

from albert_jax import hints
from albert_jax import storage
from albert_jax.text import utf8

log = logging.getLogger(__name__)

FORMATS = (".tsv", ".csv", ".jsonl")


class FileFormatError(ValueError):
  """A data file that cannot be read as the task needs."""


@dataclasses.dataclass(frozen=True)
class Table:
  """A data file's rows.

  Attributes:
    path: the file.
    columns: column names (JSONL: the first object's keys).
    rows: one dict per data row, column → value (str for TSV/CSV).
    lines: [len(rows)] the 1-based line each row starts on.
    has_header: whether the file's first row named the columns.
  """
  path: str
  columns: tuple[str, ...]
  rows: list[dict[str, Any]]
  lines: list[int]
  has_header: bool = True


def file_format(path: str) -> str:
  """".tsv", ".csv" or ".jsonl" from the name (after a ".gz")."""
  base = path[:-3] if path.endswith(".gz") else path
  ext = storage.path(base).suffix.lower()
  if ext not in FORMATS:
    raise FileFormatError(f"{path}: unknown format {ext or '(none)'!r}; name "
                          f"the file *{', *'.join(FORMATS)} (optionally .gz).")
  return ext


def _lines(path: str):
  """Yields (line number, text) with strict UTF-8 decoding line by line
  (`albert_jax.text.utf8`), so a bad byte is reported where it is."""
  decoder = utf8.LineDecoder(path)
  try:
    with storage.path(path).open("rb") as stored, (
        gzip.GzipFile(fileobj=stored, mode="rb") if path.endswith(".gz")
        else stored) as f:
      for raw in f:
        try:
          text = decoder.decode(raw)
        except utf8.EncodingError as e:
          raise FileFormatError(str(e)) from None
        yield decoder.number, text
  except (gzip.BadGzipFile, EOFError) as e:
    raise FileFormatError(f"{path}: not a complete gzip file ({e}).") from None


def iter_lines(path: str):
  """Yields (1-based line number, text) of a UTF-8 file (optionally .gz),
  one line at a time; bad bytes are reported with their line."""
  return _lines(path)


def iter_rows(path: str, header: Optional[Sequence[str]] = None,
              what: str = "data file"):
  """Yields (line number, row dict) of a TSV/CSV/JSONL(.gz) file one row at
  a time, in bounded memory (`read_table` holds them all).

  Raises:
    FileFormatError: as `read_table`, when the bad row is reached.
  """
  path = os.fspath(path)
  ext = file_format(path)
  if not storage.path(path).is_file():
    raise FileFormatError(f"{what} {path!r} does not exist; check the path.")
  records = _records(path, ext)
  columns = None if header is None else tuple(header)
  if columns is None and ext != ".jsonl":
    first = next(records, None)
    if first is None:
      raise FileFormatError(f"{what} {path} is empty.")
    columns = tuple(first[1])
  for number, fields in records:
    if isinstance(fields, dict):
      yield number, fields
    elif len(fields) != len(columns):
      raise FileFormatError(
          f"{what} {path}, line {number}: {len(fields)} fields, but there "
          f"are {len(columns)} columns ({', '.join(columns)}).")
    else:
      yield number, dict(zip(columns, fields))


def _records(path: str, ext: str):
  """Yields (line number, fields) per non-blank record: a list of str for
  TSV/CSV, a dict for JSONL."""
  if ext == ".tsv":
    for number, text in _lines(path):
      text = text.rstrip("\r\n")
      if text:
        yield number, text.split("\t")
  elif ext == ".jsonl":
    for number, text in _lines(path):
      if not text.strip():
        continue
      try:
        obj = json.loads(text)
      except json.JSONDecodeError as e:
        raise FileFormatError(f"{path}, line {number}: invalid JSON ({e.msg} "
                              f"at column {e.colno}); write one JSON object "
                              "per line.") from None
      if not isinstance(obj, dict):
        raise FileFormatError(f"{path}, line {number}: a JSON "
                              f"{type(obj).__name__}, not an object; write "
                              'one {"column": value, ...} object per line.')
      bad = utf8.lone_surrogate(obj)
      if bad:
        raise FileFormatError(f"{path}, line {number}: {bad}. Fix the "
                              "escape (a pair: \\ud83d\\ude00) or drop "
                              "the line.")
      yield number, obj
  else:
    lines = _lines(path)
    reader = csv.reader((text for _, text in lines))
    end = 0
    while True:
      try:
        row = next(reader)
      except StopIteration:
        return
      except csv.Error as e:
        raise FileFormatError(
            f"{path}, line {reader.line_num}: {e}. Quote fields that hold "
            "commas, quotes or newlines; for very long texts use TSV or "
            "JSONL.") from None
      start, end = end + 1, reader.line_num
      if row:
        yield start, row


def read_table(path: str, header: Optional[Sequence[str]] = None,
               what: str = "data file") -> Table:
  """Reads a TSV/CSV/JSONL(.gz) file into rows (see the module docstring).

  Args:
    path: the file.
    header: column names by position for a TSV/CSV without a header row.
    what: how errors name the file ("data.train_file").

  Raises:
    FileFormatError: missing or empty file, bad bytes, ragged rows, ...
  """
  path = os.fspath(path)
  ext = file_format(path)
  if not storage.path(path).is_file():
    raise FileFormatError(
        f"{what} {path!r} does not exist; check the path"
        + ("." if storage.is_remote(path)
           else f" (relative paths start at {os.getcwd()})."))
  if header is not None and ext == ".jsonl":
    raise FileFormatError(f"{what} {path}: data.header is for TSV/CSV files "
                          "without a header row; JSONL rows name their "
                          "fields. Remove data.header.")
  records = _records(path, ext)
  columns = None if header is None else tuple(header)
  if header is None and ext != ".jsonl":
    first = next(records, None)
    if first is None:
      raise FileFormatError(f"{what} {path} is empty.")
    columns = tuple(first[1])
  if columns is not None and len(set(columns)) != len(columns):
    dupes = sorted({c for c in columns if columns.count(c) > 1})
    raise FileFormatError(f"{what} {path}: duplicate column names {dupes}; "
                          "name every column differently.")
  rows, lines = [], []
  for number, fields in records:
    if isinstance(fields, dict):
      columns = columns or tuple(fields)
      rows.append(fields)
    elif len(fields) != len(columns):
      raise FileFormatError(
          f"{what} {path}, line {number}: {len(fields)} fields, but there "
          f"are {len(columns)} columns ({', '.join(columns)}). "
          + ("TSV fields may not contain TAB characters; " if ext == ".tsv"
             else "quote fields that contain commas; ")
          + "if the file has no header row, name its columns in data.header.")
    else:
      rows.append(dict(zip(columns, fields)))
    lines.append(number)
  if not rows:
    raise FileFormatError(
        f"{what} {path} " + ("has no data rows below its header."
                             if header is None and ext != ".jsonl"
                             else "is empty."))
  return Table(path, columns, rows, lines, has_header=header is None)


def label_key(value: Any) -> str:
  """A label as the string that identifies it: JSON 1 and TSV "1" agree."""
  return value if isinstance(value, str) else json.dumps(value)


def sorted_labels(keys) -> list[str]:
  """The distinct label keys (see `label_key`) in their canonical order:
  numeric when every label is an integer, else string order."""
  keys = sorted(set(keys))
  try:
    return sorted(keys, key=int)
  except ValueError:
    return keys


def label_keys(values: Sequence[Any], what: str,
               lines: Sequence[int]) -> list[str]:
  """The label keys (`label_key`) of a label column, surrounding whitespace
  stripped: "spam " is "spam", as a stray space in a spreadsheet cell means
  it to be. Warns once per file with the count.

  Args:
    values: the column's values.
    what: the file, as messages name it ("data.train_file PATH").
    lines: [len(values)] the line each value is on.

  Raises:
    FileFormatError: an empty or null label (JSON `null` would otherwise be
      the class "null"), naming its line.
  """
  keys = [label_key(v) for v in values]
  stripped = [k.strip() for k in keys]
  for value, key, line in zip(values, stripped, lines):
    if value is None or key == "":
      raise FileFormatError(
          f"{what}, line {line}: {'null' if value is None else 'empty'} "
          "label; fill it in or drop the row.")
  changed = [(k, s) for k, s in zip(keys, stripped) if k != s]
  if changed:
    log.warning("%s: stripped the surrounding whitespace of %d label(s), "
                "e.g. %r → %r.", what, len(changed), *changed[0])
  return stripped


def one_spelling_per_number(keys_by_file: Mapping[str, Sequence[str]]
                            ) -> dict[str, str]:
  """Label key → the one spelling of its number, for numbers written more
  than one way across the files ("1", "1.0", JSON 1.0): one class, not
  two. A whole number is spelt as an integer ("1"); another takes its most
  frequent spelling. Logs a note per number it joins.

  Args:
    keys_by_file: file (as the note names it) → its label keys.

  Returns:
    Only the spellings that change.
  """
  spellings: dict[float, collections.Counter] = {}
  for keys in keys_by_file.values():
    for key in keys:
      try:
        number = float(key)
      except ValueError:
        continue
      if math.isfinite(number):
        spellings.setdefault(number, collections.Counter())[key] += 1
  out = {}
  for number, counts in spellings.items():
    if len(counts) < 2:
      continue
    one = (str(int(number)) if number == int(number)
           else max(counts, key=lambda k: (counts[k], -len(k), k)))
    for key in counts:
      if key != one:
        out[key] = one
    files = [f for f, keys in keys_by_file.items()
             if any(k in counts for k in keys)]
    log.warning("Labels %s are one number; they are read as one class %r (in "
             "%s).", ", ".join(repr(k) for k in sorted(counts)), one,
             "; ".join(files))
  return out


def check_case_variants(counts: Mapping[str, int], what: str) -> None:
  """Refuses labels that differ only in case ("spam" and "Spam"): an
  accident in the data, which would train them as two classes.

  Args:
    counts: label → rows.
    what: the file, as the error names it.

  Raises:
    FileFormatError: naming the variants, their rows and the fix.
  """
  groups: dict[str, list[tuple[str, int]]] = {}
  for key, n in counts.items():
    groups.setdefault(key.casefold(), []).append((key, n))
  clashes = [sorted(g, key=lambda kn: (-kn[1], kn[0]))
             for g in groups.values() if len(g) > 1]
  if not clashes:
    return
  shown = "; ".join(", ".join(f"{k!r} ({n} rows)" for k, n in group)
                    for group in clashes[:3])
  (common, _), (rare, _) = clashes[0][:2]
  raise FileFormatError(
      f"{what} has labels that differ only in case: {shown}. Write each "
      f"label one way (e.g. every {rare!r} as {common!r}), or name the "
      "classes distinctly if they are meant to differ.")


def column(table: Table, name: str, what: str,
           key: str = "the column name") -> list[Any]:
  """A column's values; a missing column is an error listing those found
  and the closest.

  Args:
    table: the file's rows.
    name: the column.
    what: how the error names the file ("data.train_file").
    key: the config key that named the column ("data.label_column").
  """
  if name not in table.columns:
    raise FileFormatError(
        f"{what} {table.path} has no column {name!r}"
        f"{hints.did_you_mean(name, table.columns)}; its columns are "
        f"{list(table.columns)}. Fix {key} in the config"
        + ("." if table.has_header else " or data.header."))
  values = []
  for row, line in zip(table.rows, table.lines):
    if name not in row:  # JSONL objects need not share keys
      raise FileFormatError(f"{what} {table.path}, line {line}: no field "
                            f"{name!r}{hints.did_you_mean(name, row)}; every JSON "
                            "object needs one.")
    values.append(row[name])
  return values


def write_table(path: str, table: Table) -> None:
  """Writes rows in the format `path` names (gzip with mtime 0, so the same
  rows give the same bytes)."""
  ext = file_format(path)
  if ext == ".jsonl":
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in table.rows]
  elif ext == ".tsv":
    lines = (["\t".join(table.columns) + "\n"] if table.has_header else [])
    lines += ["\t".join(r[c] for c in table.columns) + "\n"
              for r in table.rows]
  else:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if table.has_header:
      writer.writerow(table.columns)
    writer.writerows([r[c] for c in table.columns] for r in table.rows)
    lines = [out.getvalue()]
  data = "".join(lines).encode("utf-8")
  if path.endswith(".gz"):
    data = gzip.compress(data, mtime=0)
  storage.write_atomic(path, data)
