"""ALBERT's SentencePiece text handling: preprocessing, word starts, offsets.

The official `tokenization.py` normalises text before SentencePiece sees it
(`preprocess_text`), splits "…9," pieces after it (`encode_pieces`) and
`create_pretraining_data.py` decides which pieces start a word. The
`Tokenizer` in `albert_jax.text.tokenizer` applies these; the alignment functions
here map SentencePiece's piece ranges in the normalised text back to
characters of the original text, for span tasks such as SQuAD.
"""

import re
import string
from typing import Callable, Optional
import unicodedata

import numpy as np

SPIECE_UNDERLINE = "\u2581"
CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")
# The README's spm_train call also reserved these; pass as `user_symbols`.
ALBERT_USER_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")
# create_pretraining_data._is_start_piece_sp: note no ' < = > in this set.
_SPM_PUNCT = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_SPM_NON_START = frozenset(string.ascii_lowercase) | _SPM_PUNCT

Offsets = list[tuple[int, int]]


def preprocess_text(text: str, do_lower_case: bool = True,
                    keep_accents: bool = False) -> str:
  """ALBERT's `preprocess_text` with HF's quote rewrite (``, '' -> ")."""
  out = " ".join(text.strip().split())
  out = out.replace("``", '"').replace("''", '"')
  # ASCII text has no accents: NFKD leaves it as it is and no character is
  # combining, so skipping the per-character pass (half of corpus
  # preparation's time on English text) changes nothing.
  if not keep_accents and not out.isascii():
    out = unicodedata.normalize("NFKD", out)
    out = "".join(c for c in out if not unicodedata.combining(c))
  return out.lower() if do_lower_case else out


def preprocess_with_alignment(
    text: str, do_lower_case: bool = True,
    keep_accents: bool = False) -> tuple[str, Offsets]:
  """`preprocess_text`, also giving each output char's source chars.

  Returns:
    (normalized, spans): `normalized == preprocess_text(text, ...)` and
    `spans[i] = (start, end)`, the characters of `text` that output char i
    came from (a collapsed whitespace run maps to its first char, a rewritten
    `` to both of its chars, each char of a decomposition to its source).
  """
  out, spans = [], []
  gap = None
  for m in re.finditer(r"\S+", text):  # \s is str.split()'s whitespace
    if gap is not None:
      out.append(" ")
      spans.append((gap, gap + 1))
    word, start = m.group(), m.start()
    gap = m.end()
    if word.isascii() and "``" not in word and "''" not in word:
      # The common case: every step leaves the word's length alone.
      out.append(word)
      spans += zip(range(start, gap), range(start + 1, gap + 1))
      continue
    chunks = []  # (output text, start, end in `text`)
    for i, c in enumerate(word, start):
      # The quote rewrite, as str.replace: left to right, non-overlapping
      # (a pair never spans words: the whitespace between them stays).
      if chunks and chunks[-1][0] + c in ("``", "''"):
        chunks[-1] = ('"', chunks[-1][1], i + 1)
      else:
        chunks.append((c, i, i + 1))
    for c, s, e in chunks:
      if not keep_accents:
        # Per-char NFKD equals whole-string NFKD once combining marks are
        # gone: canonical reordering only permutes the marks themselves.
        c = "".join(d for d in unicodedata.normalize("NFKD", c)
                    if not unicodedata.combining(d))
      out.append(c)
      # Lower-casing may lengthen a char ("İ" -> "i̇"): the pieces share its
      # span.
      spans += [(s, e)] * len(c.lower() if do_lower_case else c)
  out = "".join(out)
  # Whole-string lower: final sigma depends on context (same length).
  return (out.lower() if do_lower_case else out), spans


def is_start_piece(piece: str) -> bool:
  """Official SentencePiece word-start rule (create_pretraining_data.py)."""
  return (piece.startswith((SPIECE_UNDERLINE, "<")) or piece in _SPM_PUNCT or
          not all(c.lower() in _SPM_NON_START for c in piece))


def digit_comma_split(piece: str, encode: Callable[[str], list]
                      ) -> Optional[list]:
  """encode_pieces' split of a "…9," piece, or None for any other piece.

  The piece is re-encoded (by `encode`, text → pieces) without its comma so
  numbers split as "9" "," "000" (as ALBERT's data was); the ▁ is kept only
  if it had one.
  """
  if not (len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()):
    return None
  sub = encode(piece[:-1].replace(SPIECE_UNDERLINE, ""))
  if piece[0] != SPIECE_UNDERLINE and sub[0][0] == SPIECE_UNDERLINE:
    sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:]] + sub[1:]
  return sub + [","]


def split_ranges(split: list, begin: int, end: int) -> list:
  """(piece, start, end) in the normalized text for a split "…9," piece.

  The comma is the last char; the other pieces share the rest in order, or
  each get all of it if SentencePiece's normalisation changed its length.
  """
  comma = max(begin, end - 1)
  ends = np.cumsum([len(s.replace(SPIECE_UNDERLINE, "")) for s in split[:-1]])
  if ends[-1] != comma - begin:
    return [(s, begin, comma) for s in split[:-1]] + [(",", comma, end)]
  starts = np.concatenate([[0], ends[:-1]])
  return [(s, begin + int(i), begin + int(j))
          for s, i, j in zip(split[:-1], starts, ends)] + [(",", comma, end)]


def char_bounds(text: str, byte_bounds: np.ndarray) -> np.ndarray:
  """UTF-8 byte offsets into `text` (as SentencePiece reports them) → char
  offsets; any int array shape."""
  if text.isascii():
    return byte_bounds
  code = np.frombuffer(text.encode("utf-32-le"), np.uint32)
  size = 1 + (code >= 0x80) + (code >= 0x800) + (code >= 0x10000)
  return np.searchsorted(np.concatenate([[0], np.cumsum(size)]), byte_bounds)


def source_offsets(spans: Offsets, begins, ends) -> Offsets:
  """Ranges of normalized chars → ranges of the original text.

  Args:
    spans: `preprocess_with_alignment`'s source span of each normalized char.
    begins, ends: [n] half-open ranges in the normalized text.

  Returns:
    [n] (start, end): a range's first char's start and last char's end. An
    empty range starts where the next char does (or at the end), and no end
    falls before an earlier one (where one source char gave several
    normalized chars).
  """
  table = np.asarray(spans, np.int64).reshape(-1, 2)
  begins, ends = np.asarray(begins), np.asarray(ends)
  start = np.append(table[:, 0], table[-1, 1])[begins]
  end = np.where(begins < ends, table[np.maximum(ends - 1, 0), 1], start)
  end = np.maximum.accumulate(end)
  return list(zip(start.tolist(), end.tolist()))
