r"""Where to pack pre-training rows: offline in `prepare`, or in the loader.

Prepares the bundled corpus as the demo does (max_seq_length 128,
dupe_factor 2) unpacked and packed (K = 3) and reports, for each:
  * prepare's wall time (offline packing's whole cost, paid once);
  * the share of padding over all rows;
  * the loader's time per batch of 32 rows (masking included).
Then the in-loader alternative, measured on the unpacked records: each
step reads the records 32 packed rows hold on average (32 × instances /
packed rows of the offline run) from the shuffled stream and packs them
with the same best-fit decreasing (`instances.pack_rows`). Reported: its
time per step, and how many rows a window fills. A window does not fill
exactly 32 rows, so a loader that packs
must carry instances over to the next step (then step s depends on every
step before it, and resuming needs that carry in the checkpoint) or drop
them (data lost); offline packing keeps the batch a function of (seed,
step) alone.

  python experiments/benchmarks/packing.py --tokenizer=WORKDIR/spm/spiece.model

With `--prepared=UNPACKED_DIR,PACKED_DIR` (e.g. the data/ of two demo
workdirs, `--config.data.pack=0` and `=3`) it measures those instead of
preparing (prepare's time is then in each run's log).
"""

import argparse
import os
import tempfile
import time

import numpy as np

from albert_jax.text import documents
from albert_jax.data import instances as instances_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import masking
from albert_jax.data import prepare
from albert_jax.text.tokenizer import Tokenizer

BATCH, K, STEPS = 32, 3, 40


def _prepare(tokenizer: str, out: str, pack: int) -> tuple[float, dict]:
  start = time.perf_counter()
  stats = documents.ReadStats()
  docs = prepare.open_documents(documents.corpus_pattern("bundled"),
                                "sentences", stats)
  meta = prepare.prepare(docs, prepare.PrepareConfig(
      tokenizer=tokenizer, output_dir=out, max_seq_length=128,
      dupe_factor=2, eval_fraction=0.02, num_workers=1, seed=0, pack=pack),
                         stats, progress=None)
  return time.perf_counter() - start, meta


def _loader_ms(out: str, vocab) -> float:
  loader = loader_lib.Loader(out, global_batch_size=BATCH, vocab=vocab,
                             seed=0, process_index=0, process_count=1,
                             masking_config=masking.MaskingConfig(),
                             prefetch=0)
  loader.local_batch(0)
  start = time.perf_counter()
  for step in range(1, STEPS + 1):
    loader.local_batch(step)
  return 1e3 * (time.perf_counter() - start) / STEPS


def _in_loader(out: str, vocab, window: int) -> tuple[float, list[int]]:
  """ms per step to read a window of `window` records and pack it; the
  rows each window filled."""
  loader = loader_lib.Loader(out, global_batch_size=window, vocab=vocab,
                             seed=0, process_index=0, process_count=1,
                             masking_config=None, prefetch=0)
  source = loader._source  # pylint: disable=protected-access
  rows = []
  start = time.perf_counter()
  for step in range(STEPS):
    records, _ = loader.record_indices(step)
    lengths = [len(instances_lib.from_bytes(r).tokens)
               for r in source.__getitems__(records.tolist())]
    rows.append(len(instances_lib.pack_rows(lengths, 128, K)))
  return 1e3 * (time.perf_counter() - start) / STEPS, rows


def main():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--tokenizer", required=True)
  p.add_argument("--prepared", default="",
                 help="UNPACKED_DIR,PACKED_DIR to measure instead of preparing")
  args = p.parse_args()
  vocab = loader_lib.Vocabulary.from_tokenizer(
      Tokenizer.from_file(args.tokenizer))
  with tempfile.TemporaryDirectory() as tmp:
    dirs = args.prepared.split(",") if args.prepared else [
        os.path.join(tmp, f"pack{pack}") for pack in (0, K)]
    for pack, out in zip((0, K), dirs):
      seconds = None
      if args.prepared:
        meta = loader_lib.read_metadata(out)
      else:
        seconds, meta = _prepare(args.tokenizer, out, pack)
      train = meta["splits"]["train"]
      rows = train.get("rows", train["instances"])
      padding = 1 - train["tokens"] / (rows * 128)
      took = "" if seconds is None else f"prepare {seconds:.1f} s, "
      window = round(BATCH * train["instances"] / rows)
      print(f"pack={pack}: {took}{train['instances']} instances in {rows} "
            f"rows, padding {padding:.2%}, loader "
            f"{_loader_ms(out, vocab):.1f} ms/batch of {BATCH}")
    ms, rows = _in_loader(dirs[0], vocab, window)
    print(f"in-loader packing of {window}-record windows: {ms:.1f} ms/step "
          f"(read + pack, before masking); rows filled per window: min "
          f"{min(rows)}, mean {np.mean(rows):.1f}, max {max(rows)} "
          f"(a step has {BATCH})")


if __name__ == "__main__":
  main()
