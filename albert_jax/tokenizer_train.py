"""Training an ALBERT SentencePiece vocabulary, and its command line.

The vocabulary is built the way ALBERT's README did (unigram, <pad>=0,
<unk>=1, [CLS]=2, [SEP]=3, [MASK]=4, no bos/eos, character coverage 0.99995)
from corpora in the official pre-training format: UTF-8, one sentence a line,
a blank line between documents, `.gz` allowed. Sentences get the same
preprocessing as `Tokenizer.encode`, so training and encoding agree.

`Tokenizer.train` is the usual entry point; this module holds the corpus
reading and the trainer call.

CLI: python -m albert_jax.tokenizer train --input 'corpus/*.txt.gz' \
       --vocab_size 30000 --output spiece.model
"""

import argparse
import glob
import gzip
import os
import random
import sys
import time
import warnings
from typing import Iterable, Iterator, Optional, Sequence, Union

import sentencepiece as spm

from albert_jax.tokenizer import (ALBERT_USER_SYMBOLS, CONTROL_SYMBOLS,
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
  for key, what in (("non_utf8", "were not valid UTF-8"),
                    ("too_long", f"exceeded {MAX_LINE_BYTES} bytes")):
    if stats[key]:
      total = stats["lines"] + stats["too_long"]
      # stacklevel 3: the warning points at the caller of Tokenizer.train.
      warnings.warn(f"Skipped {stats[key]} of {total} lines that {what} in "
                    f"{_names(paths)}.", stacklevel=3)
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
  stats["seconds"] = round(time.time() - start, 2)
  return prefix + ".model", stats


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point: `train` a SentencePiece model."""
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
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
