"""ALBERT's SentencePiece tokenizer (and BERT WordPiece), training included.

`Tokenizer.train` builds a vocabulary the way ALBERT's README did (unigram,
<pad>=0, <unk>=1, [CLS]=2, [SEP]=3, [MASK]=4, no bos/eos, character coverage
0.99995) from corpora in the official pre-training format: UTF-8, one sentence
a line, a blank line between documents, `.gz` allowed. Encoding follows the
official `tokenization.py` (`preprocess_text` + `encode_pieces`, including the
"9,000" digit-comma split) plus HF's ``/'' -> " rewrite, so ids match
transformers' `AlbertTokenizer` except where HF v5 dropped that split.

CLI: python -m albert_jax.tokenizer train --input 'corpus/*.txt.gz' \
       --vocab_size 30000 --output spiece.model
"""

import argparse
import glob
import gzip
import json
import os
import random
import string
import sys
import time
import unicodedata
import warnings
from typing import Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import sentencepiece as spm

SPIECE_UNDERLINE = "\u2581"
CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")
# The README's spm_train call also reserved these; pass as `user_symbols`.
ALBERT_USER_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")
MAX_LINE_BYTES = 1 << 20
# create_pretraining_data._is_start_piece_sp: note no ' < = > in this set.
_SPM_PUNCT = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_SPM_NON_START = frozenset(string.ascii_lowercase) | _SPM_PUNCT
_SPM_NAMES = ("spiece.model",)
_WP_NAMES = ("tokenizer.json", "vocab.txt")
_CONFIG = "tokenizer_config.json"
_WP_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

Files = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def preprocess_text(text: str, do_lower_case: bool = True,
                    keep_accents: bool = False) -> str:
  """ALBERT's `preprocess_text` with HF's quote rewrite (``, '' -> ")."""
  out = " ".join(text.strip().split())
  out = out.replace("``", '"').replace("''", '"')
  if not keep_accents:
    out = unicodedata.normalize("NFKD", out)
    out = "".join(c for c in out if not unicodedata.combining(c))
  return out.lower() if do_lower_case else out


def is_start_piece(piece: str) -> bool:
  """Official SentencePiece word-start rule (create_pretraining_data.py)."""
  return (piece.startswith((SPIECE_UNDERLINE, "<")) or piece in _SPM_PUNCT or
          not all(c.lower() in _SPM_NON_START for c in piece))


def expand_files(files: Files) -> list:
  """Expands globs (sorted, deduplicated); raises if one matches nothing."""
  patterns = [files] if isinstance(files, (str, os.PathLike)) else list(files)
  out = {}  # an ordered set
  for pattern in map(os.fspath, patterns):
    matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else (
        [pattern] if os.path.exists(pattern) else [])
    if not matches:
      raise ValueError(f"No input files match {pattern!r}.")
    out.update(dict.fromkeys(matches))
  return list(out)


def _read_lines(paths: Sequence[str], stats: dict) -> Iterator[bytes]:
  """Yields raw lines; counts (rather than crashes on) over-long lines."""
  for path in paths:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
      while True:
        # readline's size cap keeps one huge line from filling memory.
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
          break
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
          stats["too_long"] += 1
          while line and not line.endswith(b"\n"):  # drain the rest of it
            line = f.readline(MAX_LINE_BYTES)
          continue
        yield line


def iter_sentences(paths: Sequence[str], stats: dict, **norm) -> Iterator[str]:
  """Yields preprocessed non-empty sentences; fills `stats` counters."""
  for raw in _read_lines(paths, stats):
    stats["lines"] += 1
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError:
      stats["non_utf8"] += 1
      continue
    line = preprocess_text(line, **norm)
    if line:
      stats["sentences"] += 1
      yield line


def _names(paths: Sequence[str]) -> str:
  more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
  return ", ".join(paths[:3]) + more


def reservoir_sample(items: Iterable[str], k: int, seed: int) -> list:
  """Algorithm R: a uniform k-sample in input order; memory O(k); k<=0: all."""
  if k <= 0:
    return list(items)
  rng, out = random.Random(seed), []
  for i, item in enumerate(items):
    if i < k:
      out.append((i, item))
    else:
      j = rng.randint(0, i)
      if j < k:
        out[j] = (i, item)
  return [item for _, item in sorted(out)]


def _bert_wordpiece(vocab_file: str, do_lower_case: bool, keep_accents: bool):
  """The pipeline of transformers' BertTokenizerFast, minus its templates."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(
      tokenizers.models.WordPiece.from_file(vocab_file, unk_token="[UNK]"))
  # strip_accents=None means "as lowercase", BERT's (and HF's) default.
  tok.normalizer = tokenizers.normalizers.BertNormalizer(
      lowercase=do_lower_case, strip_accents=False if keep_accents else None)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  tok.decoder = tokenizers.decoders.WordPiece()
  # Registered so "[MASK]" in text is one token, as in HF.
  tok.add_special_tokens([t for t in _WP_SPECIALS if tok.token_to_id(t)
                          is not None])
  return tok


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
      # tokenizer.json may also hold an ALBERT-style Unigram (<pad>, <unk>).
      self.pad_id = self._find("[PAD]", "<pad>")
      self.unk_id = self._find("[UNK]", "<unk>")
      special = {i for i, t in wp.get_added_tokens_decoder().items()
                 if t.special}
      # A tokenizer.json may hold a Unigram/BPE model: no "##" marks there.
      if type(wp.model).__name__ == "WordPiece":
        start = [not p.startswith("##") for p in pieces]
      else:
        start = [is_start_piece(p) for p in pieces]
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
    if os.path.isdir(path):
      tok = cls.find_in(path, do_lower_case, keep_accents)
      if tok is None:
        raise FileNotFoundError(f"No tokenizer files in {path}.")
      return tok
    norm = dict(do_lower_case=do_lower_case is not False,
                keep_accents=bool(keep_accents))
    if path.endswith(".json"):
      import tokenizers  # pylint: disable=g-import-not-at-top
      return cls(wp=tokenizers.Tokenizer.from_file(path), path=path, **norm)
    if path.endswith(".txt"):
      return cls(wp=_bert_wordpiece(path, **norm), path=path, **norm)
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
    out = os.path.join(directory, "tokenizer.json")
    self._wp.save(out)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
      f.writelines(self.id_to_piece(i) + "\n" for i in range(self.vocab_size))
    return out

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
      if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
        # encode_pieces: re-encode "…9," without its comma so numbers split
        # as "9" "," "000" (as ALBERT's data was); keep the ▁ only if it had.
        sub = self._sp.encode(piece[:-1].replace(SPIECE_UNDERLINE, ""),
                              out_type=str)
        if piece[0] != SPIECE_UNDERLINE and sub[0][0] == SPIECE_UNDERLINE:
          sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:]] + sub[1:]
        out += sub + [","]
      else:
        out.append(piece)
    return out

  def encode(self, text: str) -> list:
    """Token ids of `text` without special tokens."""
    if self._wp is not None:
      return self._wp.encode(text, add_special_tokens=False).ids
    return [self._sp.piece_to_id(p) for p in self.tokenize(text)]

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
    ids_a = self.encode(a)
    ids_b = None if b is None else self.encode(b)
    if max_length is not None:
      n_special = 2 if ids_b is None else 3
      if max_length < n_special:
        raise ValueError(f"max_length={max_length} < {n_special} special "
                         "tokens.")
      budget = max_length - n_special
      if ids_b is None:
        ids_a = ids_a[:budget]
      elif len(ids_a) + len(ids_b) > budget:
        # Port of tokenizers' LongestFirst: split the budget, the shorter
        # side keeps all it can; on ties the odd token goes to the longer.
        n1, n2 = sorted((len(ids_a), len(ids_b)))
        n2 = n1 if n1 > budget else max(n1, budget - n1)
        if n1 + n2 > budget:
          n1, n2 = budget // 2, budget // 2 + budget % 2
        if len(ids_a) > len(ids_b):
          n1, n2 = n2, n1
        ids_a, ids_b = ids_a[:n1], ids_b[:n2]
    ids = [self.cls_id] + ids_a + [self.sep_id]
    types = [0] * len(ids)
    if ids_b is not None:
      ids += ids_b + [self.sep_id]
      types += [1] * (len(ids_b) + 1)
    return {"input_ids": ids, "token_type_ids": types,
            "attention_mask": [1] * len(ids)}

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

  # Training.

  @classmethod
  def train(cls, files: Files, vocab_size: int = 30000, *,
            output: Union[str, os.PathLike] = "spiece.model",
            user_symbols: Sequence[str] = (), byte_fallback: bool = False,
            input_sentence_size: int = 10_000_000, seed: int = 12345,
            num_threads: int = os.cpu_count() or 1, do_lower_case: bool = True,
            keep_accents: bool = False, verbose: bool = False) -> "Tokenizer":
    """Trains an ALBERT SentencePiece model and loads it.

    Args:
      files: path, glob or list of them; official corpus format, `.gz` ok.
      vocab_size: number of pieces, specials included.
      output: path of the `.model` to write (a `.vocab` lands beside it).
      user_symbols: pieces never split (ALBERT used ALBERT_USER_SYMBOLS).
      byte_fallback: encode unknown characters as <0xNN> byte pieces.
      input_sentence_size: at most this many sentences are reservoir-sampled
        (the README used 1e7), bounding memory on big corpora; <=0: all.
        SentencePiece itself still drops sentences over 4192 bytes, as it
        did for ALBERT.
      seed: drives the sample and SentencePiece's own RNG.
      num_threads: SentencePiece trainer threads.
      do_lower_case, keep_accents: preprocessing, identical to `encode`'s.
      verbose: let SentencePiece log its progress.

    Returns:
      The trained Tokenizer; `.train_stats` holds line/sentence counters.

    Raises:
      ValueError: no files match, or no usable sentence in them.
    """
    start = time.time()
    paths = expand_files(files)
    stats = dict(files=len(paths), lines=0, sentences=0, non_utf8=0,
                 too_long=0)
    norm = dict(do_lower_case=do_lower_case, keep_accents=keep_accents)
    sample = reservoir_sample(iter_sentences(paths, stats, **norm),
                              input_sentence_size, seed)
    for key, what in (("non_utf8", "were not valid UTF-8"),
                      ("too_long", f"exceeded {MAX_LINE_BYTES} bytes")):
      if stats[key]:
        total = stats["lines"] + stats["too_long"]
        warnings.warn(f"Skipped {stats[key]} of {total} lines that {what} in "
                      f"{_names(paths)}.", stacklevel=2)
    if not sample:
      raise ValueError(f"No usable sentences in the training corpus "
                       f"{_names(paths)}.")
    stats["sampled"] = len(sample)
    output = os.fspath(output)
    prefix = output[:-len(".model")] if output.endswith(".model") else output
    if os.path.dirname(prefix):
      os.makedirs(os.path.dirname(prefix), exist_ok=True)
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_prefix=prefix,
        vocab_size=vocab_size, model_type="unigram", pad_id=0, unk_id=1,
        bos_id=-1, eos_id=-1, pad_piece="<pad>", unk_piece="<unk>",
        control_symbols=list(CONTROL_SYMBOLS),
        user_defined_symbols=list(user_symbols), byte_fallback=byte_fallback,
        character_coverage=0.99995, input_sentence_size=0,
        shuffle_input_sentence=False, num_threads=num_threads,
        minloglevel=0 if verbose else 2)
    tok = cls.from_file(prefix + ".model", **norm)
    stats["seconds"] = round(time.time() - start, 2)
    tok.train_stats = stats
    return tok


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point: `train` a SentencePiece model."""
  parser = argparse.ArgumentParser(prog="python -m albert_jax.tokenizer")
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("train", help="train an ALBERT SentencePiece model")
  p.add_argument("--input", required=True, nargs="+",
                 help="corpus files or globs (quote them)")
  p.add_argument("--vocab_size", type=int, default=30000)
  p.add_argument("--output", default="spiece.model", help="PATH.model")
  p.add_argument("--user_symbols", default="",
                 help="comma-separated; 'albert' for the README set")
  p.add_argument("--byte_fallback", action="store_true")
  p.add_argument("--input_sentence_size", type=int, default=10_000_000)
  p.add_argument("--seed", type=int, default=12345)
  p.add_argument("--num_threads", type=int, default=os.cpu_count() or 1)
  p.add_argument("--cased", action="store_true", help="no lower-casing")
  p.add_argument("--keep_accents", action="store_true")
  p.add_argument("--verbose", action="store_true")
  args = parser.parse_args(argv)
  symbols = (ALBERT_USER_SYMBOLS if args.user_symbols == "albert" else
             tuple(s for s in args.user_symbols.split(",") if s))
  try:
    tok = Tokenizer.train(
        args.input, args.vocab_size, output=args.output,
        user_symbols=symbols, byte_fallback=args.byte_fallback,
        input_sentence_size=args.input_sentence_size, seed=args.seed,
        num_threads=args.num_threads, do_lower_case=not args.cased,
        keep_accents=args.keep_accents, verbose=args.verbose)
  except (ValueError, RuntimeError) as e:  # bad corpus, or spm's complaint
    print(f"error: {e}", file=sys.stderr)
    return 2
  s = tok.train_stats
  print(f"Wrote {tok.path}: {tok.vocab_size} pieces from {s['sampled']} of "
        f"{s['sentences']} sentences ({s['lines']} lines, {s['files']} files; "
        f"skipped {s['non_utf8']} non-UTF-8, {s['too_long']} over 1 MiB) in "
        f"{s['seconds']} s. Specials: pad={tok.pad_id} unk={tok.unk_id} "
        f"cls={tok.cls_id} sep={tok.sep_id} mask={tok.mask_id}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
