"""Masking throughput on one CPU core: albert_jax vs transformers' collator.

Measures masked instances per second per core at seq 128 and 512, side by
side in one process, on the same tokenised instances:

  * a SentencePiece vocabulary (unigram, 8000 pieces) is trained on a slice
    of the bundled corpus (albert_jax/data/bundled/corpus, official format:
    one sentence a line, blank line between documents) with
    `albert_jax.text.train_tokenizer.train`, and cached;
  * the corpus is tokenised and cut into [CLS] A [SEP] B [SEP] SOP instances
    with `albert_jax.data.instances.create_instances` (the official recipe,
    10% short sequences), padded to the sequence length; also cached;
  * every implementation then masks the same padded batches.

Implementations (rows of the table):

  albert_jax mask_batch
      `albert_jax.data.masking.mask_batch` on a [B, T] NumPy batch with
      per-record keys `row_keys(seed, 0, record_index)`: the static
      (one mask per record) path of the loader; dynamic masking only changes
      the epoch in the key, not the work. ALBERT's n-gram whole-word
      masking: spans of n <= 3 words with p(n) ∝ 1/n, shrunk to fit a
      per-row budget min(20, max(1, round(0.15·len))), overlaps skipped,
      then per token 80% [MASK] / 10% random id / 10% unchanged. Word starts
      by the official SentencePiece rule (a piece starting with ▁, a
      punctuation piece, or one with a character that is not a lowercase
      letter). Returns NumPy arrays: masked input_ids [B, T] and
      masked_positions / masked_ids / masked_weights [B, 20], what the model
      consumes. Deterministic per record (counter-based hashing), so
      reproducible and resumable.
  HF wwm collator
      transformers' `DataCollatorForLanguageModeling(whole_word_mask=True)`
      (5.x has no separate `DataCollatorForWholeWordMask`: it was folded into
      this class), `return_tensors="pt"`, seeded, called the normal way on a
      list of per-instance feature dicts (input_ids, token_type_ids,
      attention_mask, special_tokens_mask, offset_mapping: what a fast
      tokenizer with return_offsets_mapping / return_special_tokens_mask
      gives). Differences in the job:
        - words: HF starts a word where a token's character start differs
          from the previous token's end, i.e. at whitespace, so "world." is
          one word where ALBERT's rule makes "." its own word. (The offsets
          are computed from the pieces; they equal the offset_mapping of
          transformers' AlbertTokenizer for this vocabulary.)
        - selection: Bernoulli(0.15) per word, expanded to the whole word
          with a [B, T, T] same-word comparison; no n-grams, no budget, no
          cap of 20 predictions (at seq 512 it masks ~15% of tokens, ALBERT's
          recipe ~4.5%: 20 of ~440);
        - 80/10/10: 5.x forces 100% [MASK] for whole-word masking; the
          script sets mask_replace_prob=0.8, random_replace_prob=0.1 back
          after construction (the code path is generic), so both do 80/10/10
          per token;
        - output: torch tensors input_ids, token_type_ids, attention_mask
          and labels [B, T] (-100 where not masked).
  HF wwm mask only
      The same collator's `torch_mask_tokens` (word ids from the offsets,
      selection, 80/10/10) on pre-stacked tensors, i.e. without the per-call
      padding / list-to-tensor conversion of its `__call__`: the most
      favourable way to time HF, an internal method rather than the API.
  HF token mlm collator
      `DataCollatorForLanguageModeling(whole_word_mask=False)`: per-token
      Bernoulli(0.15) + 80/10/10 (BERT/RoBERTa-style), a simpler job, for
      reference.

The columns "vs HF wwm collator" and "vs HF wwm mask only" divide a row's
throughput by those rows' at the same sequence length.

Timing: "per core" is enforced: thread-count variables (OMP/MKL/OpenBLAS/
...) are set to 1 before NumPy or torch is imported, torch uses 1 thread,
and the process is pinned to one CPU with `os.sched_setaffinity`. Each pass
calls an implementation on several distinct batches; after warm-up calls the
implementations take turns pass by pass (so a noisy neighbour slows them
alike), and the reported rate is the median over passes of instances per
second of process CPU time (wall-clock rates are printed too).

Usage:
  python experiments/benchmarks/data_throughput.py            # ~1 minute
  python experiments/benchmarks/data_throughput.py --quick    # ~10-20 s
Caches go to $TMPDIR/albert_jax_bench_cache (--cache_dir).
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
             "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM"):
  os.environ[_var] = "false" if _var == "TOKENIZERS_PARALLELISM" else "1"

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import datetime
import gzip
import hashlib
import importlib.util
import itertools
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

import albert_jax
from albert_jax.text import documents as documents_lib
from albert_jax.data import instances as instances_lib
from albert_jax.data import masking
from albert_jax.data import row_random
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.tokenizer import Tokenizer

CORPUS_DIR = os.path.join(os.path.dirname(albert_jax.__file__), "data",
                          "bundled", "corpus")
VOCAB_SIZE = 8000
TRAIN_LINES_PER_FILE = 20_000
SEED = 1234


def pin_to_one_core(cpu):
  """Pins this process to one CPU; returns its number."""
  allowed = sorted(os.sched_getaffinity(0))
  cpu = allowed[-1] if cpu is None else cpu
  os.sched_setaffinity(0, {cpu})
  return cpu


def cpu_model():
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
      if line.startswith("Model name:"):
        return line.split(":", 1)[1].strip()
  except (OSError, subprocess.CalledProcessError):
    pass
  return platform.processor() or "unknown"


def corpus_files():
  return sorted(os.path.join(CORPUS_DIR, f) for f in os.listdir(CORPUS_DIR)
                if f.endswith(".txt.gz"))


def corpus_digest():
  h = hashlib.sha256()
  for path in corpus_files():
    with open(path, "rb") as f:
      h.update(f.read())
  return h.hexdigest()[:16]


def get_tokenizer(cache_dir, digest):
  """Trains (once) an ~8k-piece SentencePiece model on a corpus slice."""
  model = os.path.join(cache_dir, f"spiece-{VOCAB_SIZE}-{digest}-"
                       f"{TRAIN_LINES_PER_FILE}-{SEED}.model")
  if os.path.exists(model):
    return Tokenizer.from_file(model), False
  slice_path = os.path.join(cache_dir, f"train_slice-{digest}.txt.gz")
  with gzip.open(slice_path, "wt", encoding="utf-8") as out:
    for path in corpus_files():
      with gzip.open(path, "rt", encoding="utf-8") as f:
        out.writelines(itertools.islice(f, TRAIN_LINES_PER_FILE))
  tok = text_train.train(slice_path, VOCAB_SIZE, output=model, seed=SEED,
                         num_threads=1)
  return tok, True


def round_robin_documents():
  """Documents of all corpus files, interleaved file by file."""
  iters = [documents_lib.read_sentence_files([p]) for p in corpus_files()]
  while iters:
    for it in list(iters):
      try:
        yield next(it)
      except StopIteration:
        iters.remove(it)


def get_instances(tok, seq, count, cache_dir):
  """`count` padded SOP instances of length `seq`: ids, types, attention."""
  name = os.path.splitext(os.path.basename(tok.path))[0]
  path = os.path.join(cache_dir, f"instances-{seq}-{count}-{name}.npz")
  if os.path.exists(path):
    with np.load(path) as z:
      return z["ids"], z["types"], z["attention"]
  config = instances_lib.InstanceConfig(max_seq_length=seq)
  out = []
  base = 0
  docs = round_robin_documents()
  while len(out) < count:
    block = [[tok.encode(s) for s in d] for d in itertools.islice(docs, 64)]
    if not block:
      raise ValueError(f"The corpus yields only {len(out)} instances at "
                       f"seq {seq}; ask for fewer.")
    made, _ = instances_lib.create_instances(block, config, SEED, tok.cls_id,
                                             tok.sep_id, first_index=base)
    out += made
    base += len(block)
  out = out[:count]
  ids = np.full((count, seq), tok.pad_id, np.int32)
  types = np.zeros((count, seq), np.int32)
  attention = np.zeros((count, seq), np.int32)
  for i, inst in enumerate(out):
    n = len(inst.tokens)
    ids[i, :n] = inst.tokens
    types[i, :n] = inst.token_type_ids
    attention[i, :n] = 1
  np.savez(path, ids=ids, types=types, attention=attention)
  return ids, types, attention


def hf_offsets(tok, ids, special):
  """The offset_mapping transformers' fast AlbertTokenizer reports for `ids`.

  Special and padding tokens get (0, 0); each segment's text starts at 0. A
  piece "▁xyz" covers "xyz" after one space, "xyz" follows its predecessor
  directly. HF's one quirk is kept: a lone "▁" piece is reported as covering
  the next character, so the piece after it starts a new "word" for the
  whole-word collator. (Checked against the HF tokenizer's own offsets on
  corpus sentences: identical word ids wherever the token ids agree.)
  """
  pieces = [tok.id_to_piece(i) for i in range(tok.vocab_size)]
  lead = np.array([p.startswith("\u2581") for p in pieces], np.int64)
  length = np.array([len(p) for p in pieces], np.int64) - lead
  lone = length == 0
  offsets = np.zeros(ids.shape + (2,), np.int64)
  for r in range(ids.shape[0]):
    pos = -1  # the space HF prepends to a segment is not in its text
    for t in range(ids.shape[1]):
      i = ids[r, t]
      if special[r, t]:
        pos = -1
        continue
      pos = max(pos + lead[i], 0)
      offsets[r, t] = pos, pos + max(length[i], lone[i])
      pos += length[i]
  return offsets


def make_hf_tokenizer(tok, cache_dir):
  import transformers
  hf_dir = os.path.join(cache_dir, "hf_tokenizer")
  os.makedirs(hf_dir, exist_ok=True)
  with open(tok.path, "rb") as src, open(
      os.path.join(hf_dir, "spiece.model"), "wb") as dst:
    dst.write(src.read())
  hf_tok = transformers.AlbertTokenizer.from_pretrained(hf_dir)
  assert hf_tok.mask_token_id == tok.mask_id, (hf_tok.mask_token_id,
                                               tok.mask_id)
  assert hf_tok.pad_token_id == tok.pad_id
  return hf_tok


def make_hf_collator(hf_tok, whole_word):
  import transformers
  with warnings.catch_warnings():
    # "Random token replacement is not supported with whole word masking."
    warnings.simplefilter("ignore")
    collator = transformers.DataCollatorForLanguageModeling(
        hf_tok, mlm=True, whole_word_mask=whole_word, mlm_probability=0.15,
        mask_replace_prob=0.8, random_replace_prob=0.1, return_tensors="pt",
        seed=SEED)
  # Restore ALBERT/BERT's 80/10/10, which 5.x switches off for WWM.
  collator.mask_replace_prob = 0.8
  collator.random_replace_prob = 0.1
  return collator


def measure(impls, num_batches, batch, repeats, warmup):
  """Median instances/s per implementation, timed in interleaved passes.

  Each pass calls an implementation on `num_batches` distinct batches. The
  implementations take turns pass by pass, so a noisy neighbour slows all of
  them alike. Rates use the process CPU time (what one pinned core spent:
  time stolen by other processes is not counted); wall-clock rates are kept
  for the log.
  """
  for _, fn in impls:
    for b in range(warmup):
      fn(b % num_batches)
  cpu = {name: [] for name, _ in impls}
  wall = {name: [] for name, _ in impls}
  for _ in range(repeats):
    for name, fn in impls:
      c0, w0 = time.process_time(), time.perf_counter()
      for b in range(num_batches):
        fn(b)
      c1, w1 = time.process_time(), time.perf_counter()
      cpu[name].append(num_batches * batch / (c1 - c0))
      wall[name].append(num_batches * batch / (w1 - w0))
  return ({k: statistics.median(v) for k, v in cpu.items()},
          {k: statistics.median(v) for k, v in wall.items()}, cpu)


def bench_case(seq, batch, num_batches, data, ctx, args, repeats, warmup):
  """Times every implementation on `num_batches` batches of `batch`."""
  import torch
  tok, cfg, wwm, mlm = ctx["tok"], ctx["cfg"], ctx["wwm"], ctx["mlm"]
  ids, types, attention, special, offsets = data
  real = attention.sum(1)
  sl = [slice(b * batch, (b + 1) * batch) for b in range(num_batches)]
  keys = [row_random.row_keys(SEED, 0, np.arange(s.start, s.stop)) for s in sl]
  # HF's native input: a list of per-instance feature dicts.
  features = [[{"input_ids": ids[i].tolist(),
                "token_type_ids": types[i].tolist(),
                "attention_mask": attention[i].tolist(),
                "special_tokens_mask": special[i].astype(int).tolist(),
                "offset_mapping": offsets[i].tolist()}
               for i in range(s.start, s.stop)] for s in sl]
  plain = [[{k: f[k] for k in ("input_ids", "token_type_ids",
                               "attention_mask", "special_tokens_mask")}
            for f in fs] for fs in features]
  t_ids = [torch.from_numpy(ids[s].astype(np.int64)) for s in sl]
  t_special = [torch.from_numpy(special[s]) for s in sl]

  def ours(b):
    return masking.mask_batch(ids[sl[b]], attention[sl[b]], keys[b],
                              word_start=ctx["word_start"],
                              special=ctx["special_table"],
                              mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                              config=cfg)

  def hf_wwm(b):
    return wwm(features[b])

  def hf_wwm_mask_only(b):
    return wwm.torch_mask_tokens(t_ids[b].clone(), t_special[b],
                                 offsets[sl[b]])

  def hf_mlm(b):
    return mlm(plain[b])

  # Sanity: both mask something, ours within its budget, both 80/10/10.
  out = ours(0)
  assert out["masked_weights"].sum(1).max() <= cfg.max_predictions
  hf_out = hf_wwm(0)
  hf_chosen = (hf_out["labels"] != -100).numpy()
  assert hf_chosen.any()
  ours_chosen = out["masked_weights"] > 0
  ours_mask = np.take_along_axis(out["input_ids"], out["masked_positions"],
                                 1)[ours_chosen] == tok.mask_id
  hf_mask = hf_out["input_ids"].numpy()[hf_chosen] == tok.mask_id
  n_real = real[sl[0]].sum()
  print(f"seq {seq}, batch {batch}: mean {real[:batch].mean():.0f} real "
        f"tokens; masked share: ours {ours_chosen.sum() / n_real:.3f}, HF wwm "
        f"{hf_chosen.sum() / n_real:.3f}; [MASK] share of masked: ours "
        f"{ours_mask.mean():.2f}, HF wwm {hf_mask.mean():.2f}", flush=True)

  impls = [("albert_jax mask_batch", ours)]
  if ctx.get("other_masking") is not None:
    other = ctx["other_masking"]

    def ours_other(b):
      return other.mask_batch(ids[sl[b]], attention[sl[b]], keys[b],
                              word_start=ctx["word_start"],
                              special=ctx["special_table"],
                              mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                              config=other.MaskingConfig())

    o1, o2 = ours(0), ours_other(0)
    same = all(np.array_equal(o1[k], o2[k]) for k in o1)
    print(f"  --compare_masking output identical: {same}", flush=True)
    impls.append((f"mask_batch from {ctx['other_name']}", ours_other))
  impls += [("HF wwm collator", hf_wwm),
           ("HF wwm mask only", hf_wwm_mask_only)]
  if not args.skip_token_mlm:
    impls.append(("HF token mlm collator", hf_mlm))
  rates, wall, passes = measure(impls, num_batches, batch, repeats, warmup)
  results = []
  for name, _ in impls:
    print(f"  {name:24s} {rates[name]:10.0f} inst/s/core (CPU time; wall "
          f"{wall[name]:.0f}); passes: "
          + ", ".join(f"{r:.0f}" for r in passes[name]), flush=True)
    results.append(dict(
        impl=name, seq=seq, batch=batch, per_s=rates[name],
        wall_per_s=wall[name],
        vs_collator=rates[name] / rates["HF wwm collator"],
        vs_mask_only=rates[name] / rates["HF wwm mask only"]))
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="batch 256 only, 1 batch a pass, 3 passes")
  parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
  parser.add_argument("--batch", type=int, nargs="+", default=None,
                      help="instances per call (default 64 256; --quick 256)")
  parser.add_argument("--batches", type=int, default=None,
                      help="distinct batches cycled per pass (default 4; "
                      "--quick 1)")
  parser.add_argument("--repeats", type=int, default=None,
                      help="timed passes; the median is reported "
                      "(default 7; --quick 3)")
  parser.add_argument("--cpu", type=int, default=None,
                      help="CPU to pin to (default: the last allowed one)")
  parser.add_argument("--cache_dir", default=os.path.join(
      tempfile.gettempdir(), "albert_jax_bench_cache"))
  parser.add_argument("--skip_token_mlm", action="store_true",
                      help="leave out the HF token-level reference row")
  parser.add_argument("--compare_masking", default=None, metavar="FILE",
                      help="another masking.py (e.g. an older version) to "
                      "time as an extra row, same batches and keys")
  parser.add_argument("--json", default=None, help="also write results here")
  args = parser.parse_args(argv)
  batches = args.batch or ([256] if args.quick else [64, 256])
  num_batches = args.batches or (1 if args.quick else 4)
  repeats = args.repeats or (3 if args.quick else 7)
  warmup = 1 if args.quick else 2

  cpu = pin_to_one_core(args.cpu)
  import torch
  torch.set_num_threads(1)
  torch.set_num_interop_threads(1)
  import transformers

  os.makedirs(args.cache_dir, exist_ok=True)
  digest = corpus_digest()
  t0 = time.time()
  tok, trained = get_tokenizer(args.cache_dir, digest)
  print(f"tokenizer: {tok.vocab_size} pieces "
        f"({'trained' if trained else 'cached'}, {time.time() - t0:.1f} s) "
        f"{tok.path}", flush=True)
  special_table = np.zeros(tok.vocab_size, bool)
  special_table[sorted(tok._special)] = True  # pylint: disable=protected-access
  hf_tok = make_hf_tokenizer(tok, args.cache_dir)
  ctx = dict(tok=tok, cfg=masking.MaskingConfig(),
             word_start=tok._word_start,  # pylint: disable=protected-access
             special_table=special_table,
             wwm=make_hf_collator(hf_tok, whole_word=True),
             mlm=make_hf_collator(hf_tok, whole_word=False))

  if args.compare_masking:
    spec = importlib.util.spec_from_file_location("_compare_masking",
                                                  args.compare_masking)
    other = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = other  # (dataclasses look the module up)
    spec.loader.exec_module(other)
    ctx.update(other_masking=other,
               other_name=os.path.basename(args.compare_masking))

  print(f"python {platform.python_version()}, numpy {np.__version__}, "
        f"torch {torch.__version__}, transformers {transformers.__version__}; "
        f"pinned to CPU {cpu} of {os.cpu_count()} ({cpu_model()}); "
        f"{num_batches} distinct batches a pass, {repeats} passes (median), "
        f"{warmup} warm-up calls", flush=True)
  load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
  results = []
  for seq in args.seq:
    n = max(batches) * num_batches
    t0 = time.time()
    ids, types, attention = get_instances(tok, seq, n, args.cache_dir)
    special = special_table[ids] | (attention == 0)
    data = (ids, types, attention, special, hf_offsets(tok, ids, special))
    print(f"seq {seq}: {n} instances prepared in {time.time() - t0:.1f} s",
          flush=True)
    for batch in batches:
      results += bench_case(seq, batch, num_batches, data, ctx, args,
                            repeats, warmup)

  print()
  print("| impl | seq | batch | instances/s/core | vs HF wwm collator "
        "| vs HF wwm mask only |")
  print("|---|---:|---:|---:|---:|---:|")
  for r in results:
    print(f"| {r['impl']} | {r['seq']} | {r['batch']} | {r['per_s']:,.0f} | "
          f"{r['vs_collator']:.1f}x | {r['vs_mask_only']:.1f}x |")
  print()
  print(f"instances/s/core: median over {repeats} interleaved passes of "
        f"{num_batches} batches, by process CPU time, pinned to CPU {cpu}. "
        f"Machine: {cpu_model()}, {os.cpu_count()} CPUs; "
        f"{datetime.date.today().isoformat()}; load average before: "
        f"{load_before}.")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(dict(results=results, cpu=cpu_model(), batches=batches,
                     num_batches=num_batches, repeats=repeats,
                     argv=sys.argv[1:] if argv is None else list(argv)),
                f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
