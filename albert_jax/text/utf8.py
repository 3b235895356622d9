"""Text files are UTF-8: other encodings are refused where they are found.

Every reader of the user's text files (labelled TSV/CSV/JSONL and CoNLL
files through `albert_jax.finetune.tabular`, pre-training corpora through
`albert_jax.text.documents`) decodes its lines with a `LineDecoder`. Bytes
are never turned into replacement characters or <unk> pieces: an error
names the file, the line, the byte and, for a file in another encoding, the
`iconv` command that converts it.

What `LineDecoder.decode` refuses:
  - a UTF-16 or UTF-32 byte-order mark (a UTF-8 one is dropped);
  - bytes that are not UTF-8: a damaged line, or a Latin-1 / Windows-1252
    file when no earlier line held UTF-8 text beyond ASCII (the message
    says which);
  - a line a quarter or more of whose bytes are NUL: UTF-16 without a
    byte-order mark, which puts a NUL beside every ASCII character;
  - any other NUL byte: a damaged line.
`lone_surrogate` finds what JSON lets through UTF-8 decoding: a `\ud800`
escape, half of a UTF-16 pair, which no text holds and the tokenizers
cannot take.
`EncodingError.damaged_line` tells the last kind from a file in another
encoding: a lenient reader (a web-scraped corpus) may skip such a line and
count it; the strict one (labelled data) refuses it.
"""

from __future__ import annotations

import os
import re
from typing import Any

UTF8_BOM = b"\xef\xbb\xbf"
# Longest first: UTF-32 LE's mark begins with UTF-16 LE's.
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "utf-32le", "UTF-32 (little-endian)"),
               (b"\x00\x00\xfe\xff", "utf-32be", "UTF-32 (big-endian)"),
               (b"\xff\xfe", "utf-16", "UTF-16 (little-endian)"),
               (b"\xfe\xff", "utf-16", "UTF-16 (big-endian)"))


class EncodingError(ValueError):
  """A text file, or one line of it, that is not UTF-8.

  Attributes:
    damaged_line: True for a line that is not UTF-8 in a file that may be
      (bad bytes, a stray NUL); False for a file in another encoding
      (UTF-16 or UTF-32).
    reason: what is wrong with the line, short ("not valid UTF-8 (bytes
      b'\\xe9' at byte 4)"), for a reader that skips it.
  """

  def __init__(self, message: str, damaged_line: bool = False,
               reason: str = ""):
    super().__init__(message)
    self.damaged_line = damaged_line
    self.reason = reason or message


def convert_command(path: str, source: str) -> str:
  """The shell command that re-saves `path` (optionally .gz) from encoding
  `source` as UTF-8 beside it: "iconv -f latin1 -t utf-8 a.tsv >
  a.utf8.tsv"."""
  name = os.path.basename(os.fspath(path))
  gz = name.endswith(".gz")
  stem = name[:-3] if gz else name
  base, dot, ext = stem.partition(".")
  out = f"{base}.utf8{dot}{ext}" + (".gz" if gz else "")
  if gz:
    return f"zcat {name} | iconv -f {source} -t utf-8 | gzip > {out}"
  return f"iconv -f {source} -t utf-8 {name} > {out}"


class LineDecoder:
  """Decodes one file's raw lines, in order, as UTF-8 (see the module
  docstring).

  Attributes:
    path: the file, as messages name it.
    number: the 1-based number of the line last passed in.
    offset: the byte offset (0-based, in the uncompressed text) where that
      line starts.
    utf8_seen: whether a line so far held UTF-8 text beyond ASCII.
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    self.number = 0
    self.offset = 0
    self._next = 0  # where the next line starts
    self.utf8_seen = False

  def skip(self, size: int) -> None:
    """Counts a line of `size` bytes that is read but not decoded (over a
    reader's length limit)."""
    self.number += 1
    self.offset, self._next = self._next, self._next + size

  def decode(self, raw: bytes) -> str:
    """The text of the next line `raw` (its newline kept; a leading UTF-8
    byte-order mark dropped).

    Raises:
      EncodingError: the file is not UTF-8, or this line is not (see
        `EncodingError.damaged_line`).
    """
    self.skip(len(raw))
    start = 0  # where the text starts: after a UTF-8 byte-order mark
    if self.number == 1:
      for mark, source, name in _OTHER_BOMS:
        if raw.startswith(mark):
          raise EncodingError(
              f"{self.path} starts with the byte-order mark of {name} text; "
              "albert_jax reads UTF-8. Re-save it as UTF-8, e.g. "
              f"{convert_command(self.path, source)}")
      if raw.startswith(UTF8_BOM):
        start = len(UTF8_BOM)
    try:
      text = raw[start:].decode("utf-8")
    except UnicodeDecodeError as e:
      column = start + e.start
      bad = raw[column:start + e.end]
      raise EncodingError(
          f"{self._where(column)}: bytes {bad!r} are not UTF-8; "
          + ("earlier lines are, so this line is damaged or the file mixes "
             "encodings: re-save that line as UTF-8" if self.utf8_seen else
             "the file looks like Latin-1 or Windows-1252 text. Re-save it "
             f"as UTF-8, e.g. {convert_command(self.path, 'latin1')}"),
          damaged_line=True,
          reason=f"not valid UTF-8 (bytes {bad!r} at byte {column + 1})"
      ) from None
    nul = raw.find(b"\x00", start)
    if nul >= 0:
      reason = f"not valid UTF-8 text (a NUL byte at byte {nul + 1})"
      if 4 * raw.count(b"\x00") >= len(raw) - start:
        # UTF-16 without a mark: LE puts a NUL after each ASCII byte, at an
        # odd offset; BE before it, at an even one.
        source = "utf-16le" if (self.offset + nul) % 2 else "utf-16be"
        raise EncodingError(
            f"{self._where(nul)}: NUL bytes beside the text, as UTF-16 "
            "without a byte-order mark writes it (or the file is not text); "
            "albert_jax reads UTF-8. Re-save it as UTF-8, e.g. "
            f"{convert_command(self.path, source)}", reason=reason)
      raise EncodingError(
          f"{self._where(nul)}: a NUL byte, which UTF-8 text never holds; "
          "this line is damaged: remove it or fix it.",
          damaged_line=True, reason=reason)
    if not raw[start:].isascii():
      self.utf8_seen = True
    return text

  def _where(self, column: int) -> str:
    """"PATH, line N, byte B (offset O)": `column` 0-based in the line."""
    compressed = self.path.endswith(".gz")
    return (f"{self.path}, line {self.number}, byte {column + 1} (offset "
            f"{self.offset + column}"
            + (" of the uncompressed text" if compressed else "") + ")")


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any) -> str | None:
  """The first string in `value` (a JSON value: strings, lists, objects'
  keys and values) that holds a lone UTF-16 surrogate, as a message
  fragment naming it; None if there is none.

  JSON's `\ud800` escape decodes to such a code point, which is not
  text: UTF-8 cannot encode it and SentencePiece fails on it deep inside.
  """
  stack = [value]
  while stack:
    item = stack.pop()
    if isinstance(item, str):
      found = _SURROGATE.search(item)
      if found:
        return (f"{item[max(0, found.start() - 20):found.end() + 20]!r} "
                f"holds a lone UTF-16 surrogate (\\u{ord(found.group()):x}), "
                "half of an escaped pair, which is not text")
    elif isinstance(item, dict):
      stack.extend(item.values())
      stack.extend(item.keys())
    elif isinstance(item, list):
      stack.extend(item)
  return None
