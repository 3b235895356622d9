"""Training a tokenizer vocabulary, and its command line.

A SentencePiece vocabulary is built the way ALBERT's README did (unigram,
<pad>=0, <unk>=1, [CLS]=2, [SEP]=3, [MASK]=4, no bos/eos, character coverage
0.99995); a byte-level BPE as RoBERTa's (`albert_jax.bpe.train`). Corpora are
in the official pre-training format: UTF-8, one sentence a line, a blank line
between documents, `.gz` allowed. Sentences get the same preprocessing as
`Tokenizer.encode`, so training and encoding agree.

`Tokenizer.train` is the usual entry point; this module holds the corpus
reading and the SentencePiece trainer call.

CLI: python -m albert_jax.tokenizer train --input 'corpus/*.txt.gz' \
       --vocab_size 30000 --output spiece.model
     python -m albert_jax.tokenizer train --type bpe --input 'corpus/*.gz' \
       --vocab_size 50265 --output roberta_bpe/
"""

import argparse
import glob
import gzip
import os
import random
import sys
import time
import warnings
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import sentencepiece as spm

from albert_jax.spm_text import (ALBERT_USER_SYMBOLS, CONTROL_SYMBOLS,
                                 preprocess_text)

MAX_LINE_BYTES = 1 << 20

Files = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


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


def iter_sentences(paths: Sequence[str], stats: dict,
                   normalize: Optional[Callable[[str], str]] = None,
                   **norm) -> Iterator[str]:
  """Yields preprocessed non-empty sentences; fills `stats` counters.

  `normalize` (text → text) replaces ALBERT's `preprocess_text`, which
  otherwise runs with the keyword flags `norm`.
  """
  for raw in _read_lines(paths, stats):
    stats["lines"] += 1
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError:
      stats["non_utf8"] += 1
      continue
    line = normalize(line) if normalize else preprocess_text(line, **norm)
    if line:
      stats["sentences"] += 1
      yield line


def describe(paths: Sequence[str]) -> str:
  """The first few of `paths`, for messages."""
  more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
  return ", ".join(paths[:3]) + more


_SKIPS = (("non_utf8", "were not valid UTF-8"),
          ("too_long", f"exceeded {MAX_LINE_BYTES} bytes"))


def check_corpus(stats: dict, paths: Sequence[str]) -> None:
  """After reading: one warning per kind of skipped line, and an error if
  no sentence was usable.

  Raises:
    ValueError: no usable sentence; says how many lines were skipped, and
      why.
  """
  total = stats["lines"] + stats["too_long"]
  for key, what in _SKIPS:
    if stats[key]:
      # stacklevel 4: the warning points at the caller of Tokenizer.train.
      warnings.warn(f"Skipped {stats[key]} of {total} lines that {what} in "
                    f"{describe(paths)}.", stacklevel=4)
  if not stats["sentences"]:
    skipped = "; ".join(f"{stats[k]} of its {total} lines {what}"
                        for k, what in _SKIPS if stats[k])
    raise ValueError(
        f"No usable sentences in the training corpus {describe(paths)}"
        + (f" ({skipped})" if skipped else "") + ". Give UTF-8 text with a "
        "sentence per line.")


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


def train_sentencepiece(
    files: Files, vocab_size: int = 30000, *,
    output: Union[str, os.PathLike] = "spiece.model",
    user_symbols: Sequence[str] = (), byte_fallback: bool = False,
    input_sentence_size: int = 10_000_000, seed: int = 12345,
    num_threads: int = os.cpu_count() or 1, do_lower_case: bool = True,
    keep_accents: bool = False, verbose: bool = False) -> tuple[str, dict]:
  """Trains an ALBERT SentencePiece model (`Tokenizer.train` loads it).

  Args:
    files: path, glob or list of them; official corpus format, `.gz` ok.
    vocab_size: number of pieces, specials included.
    output: path of the `.model` to write (a `.vocab` lands beside it).
    user_symbols: pieces never split (ALBERT used ALBERT_USER_SYMBOLS).
    byte_fallback: encode unknown characters as <0xNN> byte pieces.
    input_sentence_size: at most this many sentences are reservoir-sampled
      (the README used 1e7), bounding memory on big corpora; <=0: all.
      SentencePiece itself still drops sentences over 4192 bytes, as it did
      for ALBERT.
    seed: drives the sample and SentencePiece's own RNG.
    num_threads: SentencePiece trainer threads.
    do_lower_case, keep_accents: preprocessing, identical to `encode`'s.
    verbose: let SentencePiece log its progress.

  Returns:
    (path of the `.model`, counters of files/lines/sentences/skips/seconds).

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
  check_corpus(stats, paths)
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
  stats["seconds"] = round(time.time() - start, 2)
  return prefix + ".model", stats


# Flags of one kind of vocabulary only; None = not given.
_SPM_ONLY = ("user_symbols", "byte_fallback", "cased", "keep_accents")
_BPE_ONLY = ("min_frequency",)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point: `train` a SentencePiece model or a byte-level BPE."""
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog="python -m albert_jax.tokenizer")
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("train", help="train an ALBERT SentencePiece model or a "
                     "RoBERTa byte-level BPE")
  p.add_argument("--type", default="sentencepiece",
                 choices=("sentencepiece", "bpe"))
  p.add_argument("--input", required=True, nargs="+",
                 help="corpus files or globs (quote them)")
  p.add_argument("--vocab_size", type=int, default=None,
                 help="default 30000 (sentencepiece), 50265 (bpe)")
  p.add_argument("--output", default=None,
                 help="PATH.model (sentencepiece, default spiece.model) or a "
                 "directory (bpe, default bpe)")
  p.add_argument("--input_sentence_size", type=int, default=None,
                 help="sentences sampled; <=0: all (default 10M for "
                 "sentencepiece, all for bpe)")
  p.add_argument("--seed", type=int, default=12345)
  p.add_argument("--verbose", action="store_true")
  p.add_argument("--num_threads", type=int, default=os.cpu_count() or 1,
                 help="SentencePiece trainer threads (BPE: the tokenizers "
                 "library's pool, RAYON_NUM_THREADS)")
  p.add_argument("--user_symbols", default=None,
                 help="sentencepiece: comma-separated; 'albert' for the "
                 "README set")
  p.add_argument("--byte_fallback", action="store_const", const=True)
  p.add_argument("--cased", action="store_const", const=True,
                 help="sentencepiece: no lower-casing")
  p.add_argument("--keep_accents", action="store_const", const=True)
  p.add_argument("--min_frequency", type=int, default=None,
                 help="bpe: the fewest occurrences a merged pair needs "
                 "(default 2)")
  args = parser.parse_args(argv)
  bpe = args.type == "bpe"
  wrong = [f"--{n}" for n in (_SPM_ONLY if bpe else _BPE_ONLY)
           if getattr(args, n) is not None]
  if wrong:
    parser.error(f"{', '.join(wrong)} do(es) not apply to --type "
                 f"{args.type}.")
  common = dict(seed=args.seed, verbose=args.verbose)
  if args.input_sentence_size is not None:
    common["input_sentence_size"] = args.input_sentence_size
  if bpe:
    options = dict(output=args.output or "bpe",
                   min_frequency=args.min_frequency or 2, **common)
  else:
    symbols = (ALBERT_USER_SYMBOLS if args.user_symbols == "albert" else
               tuple(s for s in (args.user_symbols or "").split(",") if s))
    options = dict(output=args.output or "spiece.model", user_symbols=symbols,
                   byte_fallback=bool(args.byte_fallback),
                   num_threads=args.num_threads,
                   do_lower_case=not args.cased,
                   keep_accents=bool(args.keep_accents), **common)
  vocab_size = args.vocab_size or (50265 if bpe else 30000)
  try:
    tok = Tokenizer.train(args.input, vocab_size, kind=args.type, **options)
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
