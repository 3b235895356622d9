"""Training a vocabulary: ALBERT's SentencePiece or RoBERTa's byte-level BPE.

A SentencePiece vocabulary is built the way ALBERT's README did (unigram,
<pad>=0, <unk>=1, [CLS]=2, [SEP]=3, [MASK]=4, no bos/eos, character coverage
0.99995); a byte-level BPE as RoBERTa's. Corpora are read by
`albert_jax.text.documents` in the official pre-training format (UTF-8, one
sentence a line, a blank line between documents, `.gz` and globs allowed;
bad lines counted and skipped), and SentencePiece sentences get the same
preprocessing as `Tokenizer.encode`, so training and encoding agree.
Corpora and outputs are local or `gs://` (`albert_jax.storage`); a model
for Cloud Storage is trained in a local temporary directory and copied.

  python -m albert_jax.text.train_tokenizer --input 'corpus/*.txt.gz' \
      --vocab_size 30000 --output spiece.model
  python -m albert_jax.text.train_tokenizer --type bpe --input 'corpus/*.gz' \
      --vocab_size 50265 --output roberta_bpe/
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import random
import sys
import tempfile
import time
from typing import Callable, Iterable, Iterator, Sequence, Union

from albert_jax import storage
from albert_jax.text import documents as documents_lib
from albert_jax.text import bpe as bpe_lib
from albert_jax.text import local_copies
from albert_jax.text.preprocess import ALBERT_USER_SYMBOLS
from albert_jax.text.preprocess import CONTROL_SYMBOLS
from albert_jax.text.preprocess import preprocess_text
from albert_jax.text.tokenizer import KINDS
from albert_jax.text.tokenizer import Tokenizer

Files = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

log = logging.getLogger(__name__)


def _paths(files: Files) -> list[str]:
  """Files and globs → sorted, deduplicated paths (FileNotFoundError naming
  a pattern that matches nothing)."""
  if isinstance(files, (str, os.PathLike)):
    files = [files]
  return documents_lib.expand_paths([os.fspath(f) for f in files])


def _sentences(paths: Sequence[str], stats: documents_lib.ReadStats,
               normalize: Callable[[str], str], counts: dict
               ) -> Iterator[str]:
  """The corpus's non-empty normalised sentences, in order; counts them in
  `counts["sentences"]`."""
  for document in documents_lib.read_sentence_files(paths, stats):
    for sentence in document:
      sentence = normalize(sentence)
      if sentence:
        counts["sentences"] += 1
        yield sentence


# The longest sentence SentencePiece trains on: paragraphs, not megabytes.
SENTENCE_BYTES_CAP = 1 << 16


def _max_sentence_bytes(sample: Sequence[str]) -> int:
  """SentencePiece's max_sentence_length for `sample`: its longest
  sentence's UTF-8 size, between SentencePiece's default and the cap; warns
  of the sentences over the cap, which SentencePiece leaves out."""
  sizes = [len(s.encode("utf-8")) for s in sample]
  over = sum(n >= SENTENCE_BYTES_CAP for n in sizes)
  if over:
    log.warning("%d of %d sentences are over %d bytes and are left out of "
                "the vocabulary's training (they are still tokenised).",
                over, len(sizes), SENTENCE_BYTES_CAP)
  return min(max([4192] + [n + 1 for n in sizes]), SENTENCE_BYTES_CAP)


def _describe(paths: Sequence[str]) -> str:
  more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
  return ", ".join(paths[:3]) + more


def _check_corpus(counts: dict, stats: documents_lib.ReadStats,
                  paths: Sequence[str]) -> None:
  """Raises ValueError, saying what was skipped, if nothing was usable."""
  if counts["sentences"]:
    return
  skipped = stats.skipped_non_utf8 + stats.skipped_long_lines
  raise ValueError(
      f"No usable sentences in the training corpus {_describe(paths)}"
      + (f" ({stats.skipped_non_utf8} lines were not valid UTF-8, "
         f"{stats.skipped_long_lines} exceeded {documents_lib.MAX_LINE_BYTES}"
         " bytes)" if skipped else "")
      + ". Give UTF-8 text with a sentence per line.")


def _stats(counts: dict, stats: documents_lib.ReadStats, sampled: int,
           start: float) -> dict:
  return dict(files=stats.files, sentences=counts["sentences"],
              sampled=sampled, non_utf8=stats.skipped_non_utf8,
              too_long=stats.skipped_long_lines,
              seconds=round(time.time() - start, 2))


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
  """Trains an ALBERT SentencePiece model.

  Args:
    files: path, glob or list of them; official corpus format, `.gz` ok.
    vocab_size: number of pieces, specials included.
    output: path of the `.model` to write (a `.vocab` lands beside it),
      local or `gs://` (there the `.model` is written after the `.vocab`).
    user_symbols: pieces never split (ALBERT used ALBERT_USER_SYMBOLS).
    byte_fallback: encode unknown characters as <0xNN> byte pieces.
    input_sentence_size: at most this many sentences are reservoir-sampled
      (the README used 1e7), bounding memory on big corpora; <=0: all.
      SentencePiece's own limit on a sentence's length (4192 bytes, over
      which it drops sentences silently, or fails when all are longer) is
      raised to the longest sampled sentence up to `SENTENCE_BYTES_CAP`, so
      a corpus of one paragraph per line trains on every line; longer
      sentences (a megabyte line would make training take minutes) are
      left out of the vocabulary's training with a warning.
    seed: drives the sample and SentencePiece's own RNG.
    num_threads: SentencePiece trainer threads.
    do_lower_case, keep_accents: preprocessing, identical to `encode`'s.
    verbose: let SentencePiece log its progress.

  Returns:
    (path of the `.model`, counters of files/sentences/sampled/skips/
    seconds).

  Raises:
    FileNotFoundError: a file or glob matches nothing.
    ValueError: no usable sentence in the corpus, or more pieces asked for
      than the corpus supports.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  start = time.time()
  paths = _paths(files)
  stats, counts = documents_lib.ReadStats(), {"sentences": 0}
  normalize = lambda s: preprocess_text(  # noqa: E731
      s, do_lower_case=do_lower_case, keep_accents=keep_accents)
  sample = reservoir_sample(_sentences(paths, stats, normalize, counts),
                            input_sentence_size, seed)
  _check_corpus(counts, stats, paths)
  output = os.fspath(storage.path(output))
  prefix = output[:-len(".model")] if output.endswith(".model") else output
  options = dict(
      vocab_size=vocab_size, model_type="unigram", pad_id=0, unk_id=1,
      bos_id=-1, eos_id=-1, pad_piece="<pad>", unk_piece="<unk>",
      control_symbols=list(CONTROL_SYMBOLS),
      user_defined_symbols=list(user_symbols), byte_fallback=byte_fallback,
      character_coverage=0.99995, input_sentence_size=0,
      shuffle_input_sentence=False, num_threads=num_threads,
      max_sentence_length=_max_sentence_bytes(sample),
      minloglevel=0 if verbose else 2)
  spm.set_random_generator_seed(seed)
  try:
    if not storage.is_remote(prefix):
      storage.path(prefix).parent.mkdir(parents=True, exist_ok=True)
      spm.SentencePieceTrainer.train(sentence_iterator=iter(sample),
                                     model_prefix=prefix, **options)
      _check_written(prefix)
    else:  # SentencePiece writes only local files
      name = storage.path(prefix).name
      with tempfile.TemporaryDirectory(prefix="albert_jax_") as tmp:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sample),
                                       model_prefix=os.path.join(tmp, name),
                                       **options)
        _check_written(os.path.join(tmp, name))
        local_copies.publish(tmp, storage.path(prefix).parent,
                        last=name + ".model")
  except RuntimeError as e:
    if _WRITE_FAILED.search(str(e)):
      if not storage.is_remote(prefix):  # a temporary directory goes anyway
        _remove_partial(prefix)
      where = ("a temporary local folder" if storage.is_remote(prefix)
               else storage.path(prefix).parent)
      raise OSError(
          f"Writing the SentencePiece model into {where} failed "
          f"({str(e).split(' [')[0].strip()}): the disk is full, or the "
          "folder is not writable. Free space there (or choose another "
          "folder) and run again; no partial model is left.") from e
    limit = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it "
                      r"to a value <= (\d+)", str(e))
    if not limit:
      raise
    raise ValueError(
        f"A vocabulary of {vocab_size} pieces is more than this corpus "
        f"supports (at most {limit.group(2)}); lower it "
        "(config.model.vocab_size when a run trains its own tokenizer, "
        "--vocab_size for albert_jax.text.train_tokenizer) or train on more text."
    ) from e
  return prefix + ".model", _stats(counts, stats, len(sample), start)


# SentencePiece's status when writing its .model or .vocab failed (it
# names the C++ call, not the system error).
_WRITE_FAILED = re.compile(r"\[output->Write|\[model_proto\.Serialize|"
                           r"Permission denied|No space left")


def _check_written(prefix: str) -> None:
  """Reads back the .model SentencePiece just wrote at `prefix`.

  SentencePiece does not check its model's write: on a full disk it
  returns after writing part of the file.

  Raises:
    RuntimeError: "[output->Write …] incomplete", the model does not parse.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  data = storage.path(prefix + ".model").read_bytes()
  try:
    spm.SentencePieceProcessor(model_proto=data)
  except RuntimeError as e:
    raise RuntimeError(f"{len(data)} bytes written, which do not parse "
                       "[output->Write incomplete]") from e


def _remove_partial(prefix: str) -> None:
  """Deletes what a failed SentencePiece write left at `prefix`.*."""
  for suffix in (".model", ".vocab"):
    storage.path(prefix + suffix).unlink(missing_ok=True)


def train_bpe(files: Files, vocab_size: int = 50265, *,
              output: Union[str, os.PathLike] = "bpe",
              min_frequency: int = 2, input_sentence_size: int = 0,
              seed: int = 12345, verbose: bool = False) -> tuple[str, dict]:
  """Trains a RoBERTa-style byte-level BPE and saves it (`bpe.save`).

  Each corpus line is stripped, as the data pipeline strips it before
  encoding, and blank lines are skipped. The vocabulary starts from the 256
  byte symbols, so any text encodes without `<unk>`. Training has no
  randomness: the same corpus (and sample) and vocab_size give the same
  vocabulary.

  Args:
    files: path, glob or list of them.
    vocab_size: pieces, the 5 specials and 256 byte symbols included.
    output: directory to write the files into, local or `gs://`.
    min_frequency: the fewest occurrences a pair needs to be merged.
    input_sentence_size: reservoir-sample at most this many sentences
      (memory O(sample)); <= 0 streams the whole corpus.
    seed: drives the sample.
    verbose: show the library's progress bars.

  Returns:
    (path of tokenizer.json, counters as `train_sentencepiece`'s).

  Raises:
    ValueError: vocab_size below MIN_VOCAB_SIZE, no usable sentence, or too
      little text for vocab_size pieces.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  if vocab_size < bpe_lib.MIN_VOCAB_SIZE:
    raise ValueError(
        f"vocab_size={vocab_size} is below the {bpe_lib.MIN_VOCAB_SIZE} a "
        f"byte-level BPE starts with (256 byte symbols and the specials "
        f"{bpe_lib.SPECIALS}); choose a larger one.")
  start = time.time()
  paths = _paths(files)
  stats, counts = documents_lib.ReadStats(), {"sentences": 0}
  sentences = _sentences(paths, stats, str.strip, counts)
  if input_sentence_size > 0:
    sentences = iter(reservoir_sample(sentences, input_sentence_size, seed))
  byte_level = tokenizers.pre_tokenizers.ByteLevel
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = byte_level(add_prefix_space=False)
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency,
      show_progress=verbose,
      special_tokens=[bpe_lib.added_token(s) for s in bpe_lib.SPECIALS],
      initial_alphabet=byte_level.alphabet())
  tok.train_from_iterator(sentences, trainer)
  _check_corpus(counts, stats, paths)
  size = tok.get_vocab_size(with_added_tokens=True)
  if size < vocab_size:
    raise ValueError(
        f"The training corpus {_describe(paths)} gave only {size} pieces for "
        f"vocab_size={vocab_size}: no further pair of pieces occurs "
        f"{min_frequency} times or more. Give more text, or choose "
        f"vocab_size <= {size}.")
  path = bpe_lib.save(bpe_lib.roberta_pipeline(tok.model), output)
  sampled = (min(counts["sentences"], input_sentence_size)
             if input_sentence_size > 0 else counts["sentences"])
  return path, _stats(counts, stats, sampled, start)


def train(files: Files, vocab_size: int = 30000,
          kind: str = "sentencepiece", **options) -> Tokenizer:
  """Trains a vocabulary on a corpus and loads it.

  `kind="sentencepiece"`: an ALBERT SentencePiece model; `options` as
  `train_sentencepiece`'s. `kind="bpe"`: a RoBERTa byte-level BPE written
  into the directory `output`; options as `train_bpe`'s. The returned
  Tokenizer's `.train_stats` holds the corpus counters.
  """
  if kind == "bpe":
    path, stats = train_bpe(files, vocab_size, **options)
    tok = Tokenizer.from_file(path)
  elif kind == "sentencepiece":
    path, stats = train_sentencepiece(files, vocab_size, **options)
    tok = Tokenizer.from_file(
        path, do_lower_case=options.get("do_lower_case", True),
        keep_accents=options.get("keep_accents", False))
  else:
    raise ValueError(f"Unknown tokenizer kind {kind!r}; choose one of "
                     f"{KINDS}.")
  tok.train_stats = stats
  return tok


# Flags of one kind of vocabulary only; None = not given.
_SPM_ONLY = ("user_symbols", "byte_fallback", "cased", "keep_accents")
_BPE_ONLY = ("min_frequency",)


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m albert_jax.text.train_tokenizer",
      description="Train an ALBERT SentencePiece model or a RoBERTa "
      "byte-level BPE.")
  p.add_argument("--type", default="sentencepiece", choices=KINDS)
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
  return p


def main(argv: Sequence[str] | None = None) -> int:
  """CLI entry point; returns the exit status."""
  parser = _parser()
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
    tok = train(args.input, vocab_size, kind=args.type, **options)
  except (ValueError, RuntimeError, OSError) as e:
    # A bad corpus, spm's complaint, a file not found or a full disk.
    print(f"error: {e}", file=sys.stderr)
    return 2
  s = tok.train_stats
  print(f"Wrote {tok.path}: {tok.vocab_size} pieces from {s['sampled']} of "
        f"{s['sentences']} sentences ({s['files']} files; skipped "
        f"{s['non_utf8']} non-UTF-8 lines, {s['too_long']} over 1 MiB) in "
        f"{s['seconds']} s. Specials: pad={tok.pad_id} unk={tok.unk_id} "
        f"cls={tok.cls_id} sep={tok.sep_id} mask={tok.mask_id}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
