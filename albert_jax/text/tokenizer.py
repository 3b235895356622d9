"""ALBERT's SentencePiece, BERT's WordPiece and RoBERTa's byte-level BPE.

One `Tokenizer` interface over three backends. SentencePiece encoding follows
the official `tokenization.py` (`preprocess_text` + `encode_pieces`,
including the "9,000" digit-comma split) plus HF's ``/'' -> " rewrite, so ids
match transformers' `AlbertTokenizer` except where HF v5 dropped that split
(the text handling is in `albert_jax.text.preprocess`). WordPiece and other
`tokenizers`-library vocabularies live in `albert_jax.text.wordpiece`, byte-level
BPE (ids equal to `RobertaTokenizerFast`'s) in `albert_jax.text.bpe`.
`encode_with_offsets` maps every piece back to its characters in the
original text, for span tasks such as SQuAD. Training a vocabulary is
`albert_jax.text.train_tokenizer`. Paths are local or `gs://` (`albert_jax.storage`).
"""

import json
import os
from typing import Optional, Union

import numpy as np
import sentencepiece as spm

from albert_jax import storage
from albert_jax.text import bpe as bpe_lib
from albert_jax.text import preprocess
from albert_jax.text import wordpiece
from albert_jax.text.preprocess import CONTROL_SYMBOLS
from albert_jax.text.preprocess import is_start_piece
from albert_jax.text.preprocess import Offsets

_SPM_NAMES = ("spiece.model",)
# tokenizer.json first: it is the whole pipeline; vocab.json needs
# merges.txt beside it.
_HF_NAMES = ("tokenizer.json", "vocab.txt", "vocab.json")
_CONFIG = "tokenizer_config.json"
# What `albert_jax.text.train_tokenizer` can train.
KINDS = ("sentencepiece", "bpe")


class Tokenizer:
  """SentencePiece, WordPiece or byte-level BPE tokenizer, one interface.

  Special ids (`pad_id`, `unk_id`, `cls_id`, `sep_id`, `mask_id`) are None
  when the vocabulary lacks the piece (e.g. a T5 model has no [CLS]). A BPE
  vocabulary's are RoBERTa's: cls `<s>`, sep `</s>`, mask `<mask>`, pad
  `<pad>`, unk `<unk>`.
  """

  def __init__(self, *, sp=None, wp=None, bpe=None,
               do_lower_case: bool = True, keep_accents: bool = False,
               path: Optional[str] = None):
    """One of `sp` (a SentencePieceProcessor), `wp` (a `tokenizers`
    pipeline) or `bpe` (a byte-level BPE `tokenizers` pipeline, which never
    lower-cases or strips accents, whatever the flags say)."""
    if sum(x is not None for x in (sp, wp, bpe)) != 1:
      raise ValueError("Give exactly one of sp, wp or bpe.")
    # `_hf`: the `tokenizers` pipeline that WordPiece and BPE share.
    self._sp, self._hf, self._bpe, self.path = sp, wp or bpe, bpe, path
    if bpe is not None:
      do_lower_case, keep_accents = False, True
    self.do_lower_case, self.keep_accents = do_lower_case, keep_accents
    self.train_stats: Optional[dict] = None
    n = self.vocab_size
    pieces = [self.id_to_piece(i) for i in range(n)]
    names = CONTROL_SYMBOLS
    if sp is not None:
      self.pad_id = sp.pad_id() if sp.pad_id() >= 0 else self._find("<pad>")
      self.unk_id = sp.unk_id()
      special = {i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)}
      start = [is_start_piece(p) for p in pieces]
    elif bpe is not None:
      self.pad_id, self.unk_id, special, start = bpe_lib.vocabulary_info(
          bpe, pieces)
      names = ("<s>", "</s>", "<mask>")
    else:
      self.pad_id, self.unk_id, special, start = wordpiece.vocabulary_info(
          wp, pieces, is_start_piece)
    self.cls_id, self.sep_id, self.mask_id = map(self._find, names)
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
    """Loads a `.model` (SentencePiece), `vocab.txt`, `tokenizer.json`,
    `vocab.json` + `merges.txt` (byte-level BPE) or a directory.

    `do_lower_case` (default True) and `keep_accents` (default False) drive
    ALBERT preprocessing; for vocab.txt they map to BERT's lowercase and
    strip_accents (accents stripped only when lower-casing, as in
    BertTokenizerFast); tokenizer.json carries its own and ignores them, as
    does byte-level BPE. A tokenizer.json whose model is BPE behind a
    ByteLevel pre-tokenizer (RoBERTa, GPT-2) gets the BPE backend. For a
    directory, unset flags come from its tokenizer_config.json. `path` is
    local or `gs://`.
    """
    resolved = storage.path(path)
    path = os.fspath(resolved)
    if not resolved.exists():
      raise FileNotFoundError(
          f"No tokenizer at {path}: give a SentencePiece .model, a vocab.txt, "
          "a tokenizer.json, a vocab.json (with merges.txt) or a directory "
          "holding one.")
    if resolved.is_dir():
      tok = cls.find_in(path, do_lower_case, keep_accents)
      if tok is None:
        raise FileNotFoundError(f"No tokenizer files in {path}.")
      return tok
    if resolved.name in bpe_lib.PAIR_FILES:
      return cls(bpe=bpe_lib.from_vocab_and_merges(path), path=path)
    norm = dict(do_lower_case=do_lower_case is not False,
                keep_accents=bool(keep_accents))
    if path.endswith((".json", ".txt")):
      hf = wordpiece.load(path, **norm)
      if bpe_lib.is_byte_level(hf):
        return cls(bpe=hf, path=path)
      return cls(wp=hf, path=path, **norm)
    # From bytes: SentencePiece opens only local files by name.
    return cls(sp=spm.SentencePieceProcessor(
        model_proto=resolved.read_bytes()), path=path, **norm)

  @classmethod
  def find_in(cls, directory: Union[str, os.PathLike],
              do_lower_case: Optional[bool] = None,
              keep_accents: Optional[bool] = None) -> Optional["Tokenizer"]:
    """Loads the tokenizer in `directory`, or returns None if there is none.

    Looks for spiece.model, tokenizer.json, vocab.txt, vocab.json with
    merges.txt, then any *.model. Unset flags come from
    tokenizer_config.json when present (HF layout).
    """
    directory = storage.path(directory)
    cands = [directory / n for n in _SPM_NAMES + _HF_NAMES]
    cands += sorted(directory.glob("*.model"), key=os.fspath)
    merges = directory / bpe_lib.PAIR_FILES[1]
    found = next((c for c in cands if c.is_file() and (
        c.name != "vocab.json" or merges.is_file())), None)
    if found is None:
      return None
    config = {}
    if (directory / _CONFIG).is_file():
      config = json.loads((directory / _CONFIG).read_text(encoding="utf-8"))
    if do_lower_case is None:
      do_lower_case = bool(config.get("do_lower_case", True))
    if keep_accents is None:
      keep_accents = bool(config.get("keep_accents", False))
    return cls.from_file(os.fspath(found), do_lower_case, keep_accents)

  def save(self, directory: Union[str, os.PathLike]) -> str:
    """Writes the vocabulary's files into `directory`; returns the main one.

    SentencePiece: spiece.model; WordPiece: tokenizer.json + vocab.txt; BPE:
    tokenizer.json + vocab.json + merges.txt. Each with a
    tokenizer_config.json, so transformers' AutoTokenizer loads a BPE (as
    RobertaTokenizer) and `find_in` any of them. `directory` is local or
    `gs://`; each file is written whole.
    """
    directory = storage.path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if self._bpe is not None:
      return bpe_lib.save(self._bpe, directory)
    storage.write_atomic(directory / _CONFIG, json.dumps(
        {"do_lower_case": self.do_lower_case,
         "keep_accents": self.keep_accents}))
    if self._sp is not None:
      out = directory / "spiece.model"
      storage.write_atomic(out, self._sp.serialized_model_proto())
      return os.fspath(out)
    return wordpiece.save(self._hf, directory,
                          [self.id_to_piece(i) for i in range(self.vocab_size)])

  # Vocabulary.

  @property
  def vocab_size(self) -> int:
    if self._sp is not None:
      return self._sp.get_piece_size()
    return self._hf.get_vocab_size(with_added_tokens=True)

  @property
  def is_sentencepiece(self) -> bool:
    return self._sp is not None

  @property
  def is_bpe(self) -> bool:
    """Whether this is a byte-level BPE (RoBERTa, GPT-2) vocabulary."""
    return self._bpe is not None

  @property
  def sp_model(self) -> Optional[spm.SentencePieceProcessor]:
    """The SentencePiece processor (None for other backends)."""
    return self._sp

  def id_to_piece(self, i: int) -> str:
    if self._sp is not None:
      return self._sp.id_to_piece(int(i))
    return self._hf.id_to_token(int(i))

  def piece_to_id(self, piece: str) -> int:
    """Id of `piece`; unknown pieces map to `unk_id` (like SentencePiece)."""
    if self._sp is not None:
      return self._sp.piece_to_id(piece)
    i = self._hf.token_to_id(piece)
    return self.unk_id if i is None else i

  def _find(self, piece: str) -> Optional[int]:
    """Id of `piece` if the vocabulary has it, else None."""
    if self._sp is None:
      return self._hf.token_to_id(piece)
    i = self._sp.piece_to_id(piece)  # unk_id when absent, so verify
    return i if self._sp.id_to_piece(i) == piece else None

  def is_word_start(self, ids) -> np.ndarray:
    """Word-start flags (SentencePiece: the official rule; WordPiece: no
    "##"; BPE: a leading "Ġ"; specials always). ids: int array [...] ->
    bool array [...]."""
    return self._word_start[np.asarray(ids, dtype=np.int64)]

  # Encoding.

  def normalize(self, text: str) -> str:
    """The text SentencePiece sees (the other backends normalise inside)."""
    if self._sp is None:
      return text
    return preprocess.preprocess_text(text, self.do_lower_case,
                                      self.keep_accents)

  def tokenize(self, text: str) -> list:
    """Pieces of `text` (no special tokens)."""
    if self._hf is not None:
      return self._hf.encode(text, add_special_tokens=False).tokens
    out = []
    for piece in self._sp.encode(self.normalize(text), out_type=str):
      split = self._digit_comma_split(piece)
      out += [piece] if split is None else split
    return out

  def _digit_comma_split(self, piece: str) -> Optional[list]:
    return preprocess.digit_comma_split(
        piece, lambda t: self._sp.encode(t, out_type=str))

  def encode(self, text: str) -> list:
    """Token ids of `text` without special tokens."""
    if self._hf is not None:
      return self._hf.encode(text, add_special_tokens=False).ids
    return [self._sp.piece_to_id(p) for p in self.tokenize(text)]

  def encode_with_offsets(self, text: str) -> tuple[list, Offsets]:
    """Token ids of `text` (exactly `encode`'s) and where each piece came from.

    Returns:
      (ids, offsets): `offsets[i] = (start, end)` is the half-open range of
      characters of the original `text` that piece i stands for, so
      `text[start:end]` is the piece's surface before lower-casing, accent
      stripping or quote rewriting. Starts and ends are both non-decreasing.
      A piece that stands for no character (SentencePiece's lone "▁" word
      boundary) gets an empty range where the next piece begins. A BPE piece
      covers the characters its bytes belong to (all of them for a piece of
      part of a character), without the space it starts with, as
      RobertaTokenizerFast reports it.
    """
    if self._hf is not None:
      enc = self._hf.encode(text, add_special_tokens=False)
      return list(enc.ids), [tuple(o) for o in enc.offsets]
    norm, spans = preprocess.preprocess_with_alignment(
        text, self.do_lower_case, self.keep_accents)
    pieces = self._sp.encode(norm, return_type="proto").pieces
    # SentencePiece reports UTF-8 byte offsets into `norm`.
    bounds = preprocess.char_bounds(
        norm, np.array([(p.begin, p.end) for p in pieces], np.int64))
    ids, begins, ends = [], [], []  # ranges in `norm`
    for p, (b, e) in zip(pieces, bounds.reshape(-1, 2).tolist()):
      while b < e and norm[b].isspace():  # "▁x" covers " x": drop the space
        b += 1
      split = self._digit_comma_split(p.piece)
      for piece, s, t in ([(None, b, e)] if split is None
                          else preprocess.split_ranges(split, b, e)):
        ids.append(p.id if piece is None else self._sp.piece_to_id(piece))
        begins.append(s)
        ends.append(t)
    if not ids:
      return [], []
    return ids, preprocess.source_offsets(spans, begins, ends)

  def encode_pair(self, a: str, b: Optional[str] = None,
                  max_length: Optional[int] = None) -> dict:
    """The model input of `a` (and `b`), with longest-first truncation.

    ALBERT/BERT: [CLS] a [SEP] (b [SEP]), token types 0 up to the first
    [SEP], then 1. BPE (RoBERTa): <s> a </s> (</s> b </s>), token types all
    0. Both as HF's tokenizers build them.

    Returns dict of `input_ids`, `token_type_ids`, `attention_mask`: lists of
    equal length <= max_length.
    """
    if self.cls_id is None or self.sep_id is None:
      raise ValueError(
          f"This vocabulary ({self.path or 'in memory'}) has no [CLS]/[SEP] "
          "(or <s>/</s>) pieces, so it cannot build model inputs; train one "
          "with albert_jax.text.train_tokenizer or load an ALBERT/BERT/RoBERTa vocabulary.")
    template = (bpe_lib.roberta_template if self._bpe is not None
                else wordpiece.bert_template)
    return template(self.encode(a), None if b is None else self.encode(b),
                    self.cls_id, self.sep_id, max_length)

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    """Text of `ids`; special tokens are dropped or written as their piece."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if self._hf is not None:
      return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)
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


def misfit(tokenizer, vocab_size: int, exact: bool = False) -> str | None:
  """What is wrong with `tokenizer` for a model embedding `vocab_size` ids,
  or None where it fits: the one check of "the tokenizer fits the model",
  whose callers say whose tokenizer and what to do.

  Args:
    tokenizer: anything with a `vocab_size` (a `Tokenizer`).
    vocab_size: rows of the model's embedding table.
    exact: the table is sized for this tokenizer (a run that creates the
      model), so fewer pieces are as wrong as more.

  Returns:
    e.g. "has 300 pieces but the model embeds 50 ids ([0, 49]), so its ids
    from 50 on would be misread", or None.
  """
  n = tokenizer.vocab_size
  if n > vocab_size:
    return (f"has {n} pieces but the model embeds {vocab_size} ids "
            f"([0, {vocab_size - 1}]), so its ids from {vocab_size} on "
            "would be misread")
  if exact and n != vocab_size:
    return (f"has {n} pieces but the model embeds {vocab_size} ids, so "
            f"{vocab_size - n} rows of its table would never be read")
  return None
