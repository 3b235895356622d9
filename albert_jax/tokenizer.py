"""ALBERT's SentencePiece tokenizer (and BERT WordPiece) behind one interface.

Encoding follows the official `tokenization.py` (`preprocess_text` +
`encode_pieces`, including the "9,000" digit-comma split) plus HF's ``/'' -> "
rewrite, so ids match transformers' `AlbertTokenizer` except where HF v5
dropped that split. `encode_with_offsets` maps every piece back to its
characters in the original text, through that preprocessing, for span tasks
such as SQuAD. Vocabulary training lives in `albert_jax.tokenizer_train`
(`Tokenizer.train` is its entry point).

CLI: python -m albert_jax.tokenizer train --input 'corpus/*.txt.gz' \
       --vocab_size 30000 --output spiece.model
"""

import glob
import json
import os
import re
import string
import sys
import unicodedata
from typing import Optional, Union

import numpy as np
import sentencepiece as spm

from albert_jax import wordpiece

SPIECE_UNDERLINE = "\u2581"
CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")
# The README's spm_train call also reserved these; pass as `user_symbols`.
ALBERT_USER_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")
# create_pretraining_data._is_start_piece_sp: note no ' < = > in this set.
_SPM_PUNCT = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_SPM_NON_START = frozenset(string.ascii_lowercase) | _SPM_PUNCT
_SPM_NAMES = ("spiece.model",)
_WP_NAMES = ("tokenizer.json", "vocab.txt")
_CONFIG = "tokenizer_config.json"
# Names that moved to tokenizer_train; still importable from here.
_TRAIN_NAMES = ("MAX_LINE_BYTES", "expand_files", "iter_sentences",
                "reservoir_sample", "main")

Offsets = list[tuple[int, int]]


def preprocess_text(text: str, do_lower_case: bool = True,
                    keep_accents: bool = False) -> str:
  """ALBERT's `preprocess_text` with HF's quote rewrite (``, '' -> ")."""
  out = " ".join(text.strip().split())
  out = out.replace("``", '"').replace("''", '"')
  if not keep_accents:
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


def _split_ranges(split: list, begin: int, end: int) -> list:
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


class Tokenizer:
  """ALBERT SentencePiece or BERT WordPiece tokenizer with one interface.

  Special ids (`pad_id`, `unk_id`, `cls_id`, `sep_id`, `mask_id`) are None
  when the vocabulary lacks the piece (e.g. a T5 model has no [CLS]).
  """

  def __init__(self, *, sp=None, wp=None, do_lower_case: bool = True,
               keep_accents: bool = False, path: Optional[str] = None):
    self._sp, self._wp, self.path = sp, wp, path
    self.do_lower_case, self.keep_accents = do_lower_case, keep_accents
    self.train_stats: Optional[dict] = None
    n = self.vocab_size
    pieces = [self.id_to_piece(i) for i in range(n)]
    if sp is not None:
      self.pad_id = sp.pad_id() if sp.pad_id() >= 0 else self._find("<pad>")
      self.unk_id = sp.unk_id()
      special = {i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)}
      start = [is_start_piece(p) for p in pieces]
    else:
      self.pad_id, self.unk_id, special, start = wordpiece.vocabulary_info(
          wp, pieces, is_start_piece)
    self.cls_id, self.sep_id = self._find("[CLS]"), self._find("[SEP]")
    self.mask_id = self._find("[MASK]")
    named = (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)
    self._special = frozenset(special | {i for i in named if i is not None})
    # One lookup table so is_word_start is a single gather per batch.
    self._word_start = np.array(start, dtype=bool)
    self._word_start[list(self._special)] = True

  # Loading and saving.

  @classmethod
  def from_file(cls, path: Union[str, os.PathLike],
                do_lower_case: Optional[bool] = None,
                keep_accents: Optional[bool] = None) -> "Tokenizer":
    """Loads a `.model` (SentencePiece), `vocab.txt`, `tokenizer.json` or dir.

    `do_lower_case` (default True) and `keep_accents` (default False) drive
    ALBERT preprocessing; for vocab.txt they map to BERT's lowercase and
    strip_accents (accents stripped only when lower-casing, as in
    BertTokenizerFast); tokenizer.json carries its own and ignores them.
    For a directory, unset flags come from its tokenizer_config.json.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
      raise FileNotFoundError(
          f"No tokenizer at {path}: give a SentencePiece .model, a vocab.txt, "
          "a tokenizer.json or a directory holding one.")
    if os.path.isdir(path):
      tok = cls.find_in(path, do_lower_case, keep_accents)
      if tok is None:
        raise FileNotFoundError(f"No tokenizer files in {path}.")
      return tok
    norm = dict(do_lower_case=do_lower_case is not False,
                keep_accents=bool(keep_accents))
    if path.endswith((".json", ".txt")):
      return cls(wp=wordpiece.load(path, **norm), path=path, **norm)
    return cls(sp=spm.SentencePieceProcessor(model_file=path), path=path,
               **norm)

  @classmethod
  def find_in(cls, directory: Union[str, os.PathLike],
              do_lower_case: Optional[bool] = None,
              keep_accents: Optional[bool] = None) -> Optional["Tokenizer"]:
    """Loads the tokenizer in `directory`, or returns None if there is none.

    Looks for spiece.model, tokenizer.json, vocab.txt, then any *.model.
    Unset flags come from tokenizer_config.json when present (HF layout).
    """
    directory = os.fspath(directory)
    cands = [os.path.join(directory, n) for n in _SPM_NAMES + _WP_NAMES]
    cands += sorted(glob.glob(os.path.join(glob.escape(directory), "*.model")))
    found = next((c for c in cands if os.path.isfile(c)), None)
    if found is None:
      return None
    config = {}
    if os.path.isfile(os.path.join(directory, _CONFIG)):
      with open(os.path.join(directory, _CONFIG), encoding="utf-8") as f:
        config = json.load(f)
    if do_lower_case is None:
      do_lower_case = bool(config.get("do_lower_case", True))
    if keep_accents is None:
      keep_accents = bool(config.get("keep_accents", False))
    return cls.from_file(found, do_lower_case, keep_accents)

  def save(self, directory: Union[str, os.PathLike]) -> str:
    """Writes spiece.model (or tokenizer.json + vocab.txt); returns its path."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, _CONFIG), "w", encoding="utf-8") as f:
      json.dump({"do_lower_case": self.do_lower_case,
                 "keep_accents": self.keep_accents}, f)
    if self._sp is not None:
      out = os.path.join(directory, "spiece.model")
      with open(out, "wb") as f:
        f.write(self._sp.serialized_model_proto())
      return out
    return wordpiece.save(self._wp, directory,
                          [self.id_to_piece(i) for i in range(self.vocab_size)])

  # Vocabulary.

  @property
  def vocab_size(self) -> int:
    if self._sp is not None:
      return self._sp.get_piece_size()
    return self._wp.get_vocab_size(with_added_tokens=True)

  @property
  def is_sentencepiece(self) -> bool:
    return self._sp is not None

  @property
  def sp_model(self) -> Optional[spm.SentencePieceProcessor]:
    """The SentencePiece processor (None for WordPiece/tokenizer.json)."""
    return self._sp

  def id_to_piece(self, i: int) -> str:
    if self._sp is not None:
      return self._sp.id_to_piece(int(i))
    return self._wp.id_to_token(int(i))

  def piece_to_id(self, piece: str) -> int:
    """Id of `piece`; unknown pieces map to `unk_id` (like SentencePiece)."""
    if self._sp is not None:
      return self._sp.piece_to_id(piece)
    i = self._wp.token_to_id(piece)
    return self.unk_id if i is None else i

  def _find(self, *pieces: str) -> Optional[int]:
    """Id of the first of `pieces` in the vocabulary, else None."""
    for piece in pieces:
      if self._wp is not None:
        i = self._wp.token_to_id(piece)
      else:
        i = self._sp.piece_to_id(piece)  # unk_id when absent, so verify
        i = i if self._sp.id_to_piece(i) == piece else None
      if i is not None:
        return i
    return None

  def is_word_start(self, ids) -> np.ndarray:
    """Official word-start flags. ids: int array [...] -> bool array [...]."""
    return self._word_start[np.asarray(ids, dtype=np.int64)]

  # Encoding.

  def normalize(self, text: str) -> str:
    """The text SentencePiece sees (WordPiece normalises internally)."""
    if self._sp is None:
      return text
    return preprocess_text(text, self.do_lower_case, self.keep_accents)

  def tokenize(self, text: str) -> list:
    """Pieces of `text` (no special tokens)."""
    if self._wp is not None:
      return self._wp.encode(text, add_special_tokens=False).tokens
    out = []
    for piece in self._sp.encode(self.normalize(text), out_type=str):
      split = self._digit_comma_split(piece)
      out += [piece] if split is None else split
    return out

  def _digit_comma_split(self, piece: str) -> Optional[list]:
    """encode_pieces' split of a "…9," piece, or None for any other piece.

    The piece is re-encoded without its comma so numbers split as "9" ","
    "000" (as ALBERT's data was); the ▁ is kept only if it had one.
    """
    if not (len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()):
      return None
    sub = self._sp.encode(piece[:-1].replace(SPIECE_UNDERLINE, ""),
                          out_type=str)
    if piece[0] != SPIECE_UNDERLINE and sub[0][0] == SPIECE_UNDERLINE:
      sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:]] + sub[1:]
    return sub + [","]

  def encode(self, text: str) -> list:
    """Token ids of `text` without special tokens."""
    if self._wp is not None:
      return self._wp.encode(text, add_special_tokens=False).ids
    return [self._sp.piece_to_id(p) for p in self.tokenize(text)]

  def encode_with_offsets(self, text: str) -> tuple[list, Offsets]:
    """Token ids of `text` (exactly `encode`'s) and where each piece came from.

    Returns:
      (ids, offsets): `offsets[i] = (start, end)` is the half-open range of
      characters of the original `text` that piece i stands for, so
      `text[start:end]` is the piece's surface before lower-casing, accent
      stripping or quote rewriting. Starts and ends are both non-decreasing.
      A piece that stands for no character (SentencePiece's lone "▁" word
      boundary) gets an empty range where the next piece begins.
    """
    if self._wp is not None:
      enc = self._wp.encode(text, add_special_tokens=False)
      return list(enc.ids), [tuple(o) for o in enc.offsets]
    norm, spans = preprocess_with_alignment(text, self.do_lower_case,
                                            self.keep_accents)
    pieces = self._sp.encode(norm, return_type="proto").pieces
    # SentencePiece reports UTF-8 byte offsets into `norm`.
    bounds = np.array([(p.begin, p.end) for p in pieces], np.int64)
    if not norm.isascii():
      code = np.frombuffer(norm.encode("utf-32-le"), np.uint32)
      size = 1 + (code >= 0x80) + (code >= 0x800) + (code >= 0x10000)
      bounds = np.searchsorted(np.concatenate([[0], np.cumsum(size)]),
                               bounds)
    ids, begins, ends = [], [], []  # ranges in `norm`
    for p, (b, e) in zip(pieces, bounds.reshape(-1, 2).tolist()):
      while b < e and norm[b].isspace():  # "▁x" covers " x": drop the space
        b += 1
      split = self._digit_comma_split(p.piece)
      if split is None:
        ids.append(p.id)
        begins.append(b)
        ends.append(e)
        continue
      for piece, s, t in _split_ranges(split, b, e):
        ids.append(self._sp.piece_to_id(piece))
        begins.append(s)
        ends.append(t)
    if not ids:
      return [], []
    # Back to `text`: a range's first char's start and last char's end. An
    # empty range starts where the next char does (or at the end), and no
    # end may fall before an earlier one (where one source char gave
    # several normalized chars).
    table = np.asarray(spans, np.int64).reshape(-1, 2)
    begins, ends = np.asarray(begins), np.asarray(ends)
    start = np.append(table[:, 0], table[-1, 1])[begins]
    end = np.where(begins < ends, table[np.maximum(ends - 1, 0), 1], start)
    end = np.maximum.accumulate(end)
    return ids, list(zip(start.tolist(), end.tolist()))

  def encode_pair(self, a: str, b: Optional[str] = None,
                  max_length: Optional[int] = None) -> dict:
    """[CLS] a [SEP] (b [SEP]) with HF/tokenizers longest-first truncation.

    Returns dict of `input_ids`, `token_type_ids`, `attention_mask`: lists of
    equal length <= max_length; token types 0 up to the first [SEP], then 1.
    """
    if self.cls_id is None or self.sep_id is None:
      raise ValueError(
          f"This vocabulary ({self.path or 'in memory'}) has no [CLS]/[SEP] "
          "pieces, so it cannot build ALBERT/BERT inputs; train one with "
          "Tokenizer.train or load an ALBERT/BERT vocabulary.")
    return wordpiece.bert_template(
        self.encode(a), None if b is None else self.encode(b), self.cls_id,
        self.sep_id, max_length)

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    """Text of `ids`; special tokens are dropped or written as their piece."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if self._wp is not None:
      return self._wp.decode(ids, skip_special_tokens=skip_special_tokens)
    # SentencePiece renders control ids as ""; to show them, decode the runs
    # between them separately. <unk> stays visible (as " ⁇ ") either way.
    parts, run = [], []
    for i in ids:
      if i in self._special and i != self.unk_id:
        if not skip_special_tokens:
          parts += [self._sp.decode(run), self.id_to_piece(i)]
          run = []
      else:
        run.append(i)
    parts.append(self._sp.decode(run))
    return " ".join(p for p in parts if p)

  @classmethod
  def train(cls, files, vocab_size: int = 30000, **options) -> "Tokenizer":
    """Trains an ALBERT SentencePiece model and loads it.

    `files` and the keyword `options` (output, user_symbols, byte_fallback,
    input_sentence_size, seed, num_threads, do_lower_case, keep_accents,
    verbose) are documented, with their defaults, at
    `tokenizer_train.train_sentencepiece`. The returned Tokenizer's
    `.train_stats` holds the corpus counters.
    """
    from albert_jax import tokenizer_train  # pylint: disable=g-import-not-at-top
    path, stats = tokenizer_train.train_sentencepiece(files, vocab_size,
                                                      **options)
    tok = cls.from_file(path, do_lower_case=options.get("do_lower_case", True),
                        keep_accents=options.get("keep_accents", False))
    tok.train_stats = stats
    return tok


def __getattr__(name: str):
  # Lazily, because tokenizer_train imports this module.
  if name in _TRAIN_NAMES:
    from albert_jax import tokenizer_train  # pylint: disable=g-import-not-at-top
    return getattr(tokenizer_train, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
  from albert_jax.tokenizer_train import main as _main  # pylint: disable=g-import-not-at-top
  sys.exit(_main())
