"""Corpus preparation: throughput per worker and per host, and peak memory,
as the corpus grows.

Builds corpora of --sizes MB of text by repeating the bundled corpus
(albert_jax/data/bundled/corpus/sotu.txt.gz: State of the Union addresses,
official format, ~10.8 MB and 232 documents) with distinct documents: copy
r of a document starts with the line "Copy r of address d." (so no two
documents are equal, and each copy has its own random stream anyway). Each
corpus is written as uncompressed files of --file_mb MB, each file its own
unit of work, so P processes get even shares.

For each size, processes P in --processes and workers W in --workers, it
starts P `python -m albert_jax.data.prepare --process_index=i
--process_count=P --num_workers=W` at once (as P pod hosts would run, here
on one machine), each in a wrapper that records its peak RSS and its
workers' (getrusage: the process's own peak, and the largest peak of its
waited-for children), and times each host. From the per-unit records the
hosts write (`units/unit-*.json`) it counts the documents, bytes of text
and instances each host prepared. Reported per host and per worker:
documents/s, MB/s and instances/s (a host's count over its wall time; per
worker = per host / W), the aggregate MB/s (all text over the slowest
host's time), and the peak RSS of a host's main process and of its largest
worker, the CPU seconds all processes used and the text prepared per
CPU-second (MB/CPU-s: one core's throughput, whatever else runs on the
machine), and the machine's load average before/after each row (on shared
cores, how much of a core each process really had). The claim to check: peak memory stays flat as the corpus grows
(a block of --docs_per_block documents in flight per worker, never the
corpus), and throughput grows with workers and hosts while cores are free.

The tokenizer is an 8000-piece SentencePiece model trained on the first
20000 lines of the bundled corpus (cached in $TMPDIR/albert_jax_bench_cache),
instances are SOP at --max_seq_length (default 128), dupe_factor 1.

  python experiments/benchmarks/prepare_scaling.py --sizes 10 30 100 \\
      --processes 1 2 3 --workers 1 2 --json /tmp/prepare_scaling.json
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "albert_jax" / "data" / "bundled" / "corpus" / "sotu.txt.gz"
CACHE = pathlib.Path(tempfile.gettempdir()) / "albert_jax_bench_cache"

# Runs one host and prints its peak RSS (KiB) and its workers' largest, and
# the CPU seconds (user + system) of the host and of its workers together.
_WRAPPER = """
import resource, sys
from albert_jax.data import prepare
code = prepare.main(sys.argv[1:])
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print("RSS", me.ru_maxrss, kids.ru_maxrss, me.ru_utime + me.ru_stime,
      kids.ru_utime + kids.ru_stime, flush=True)
sys.exit(code)
"""


def tokenizer() -> str:
  path = CACHE / "prepare_scaling_spm8000.model"
  if not path.exists():
    from albert_jax.text import train_tokenizer as text_train  # pylint: disable=g-import-not-at-top
    CACHE.mkdir(parents=True, exist_ok=True)
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
      lines = [next(f) for _ in range(20000)]
    (CACHE / "spm_corpus.txt").write_text("".join(lines), encoding="utf-8")
    text_train.train(str(CACHE / "spm_corpus.txt"), 8000, output=path,
                     seed=1, num_threads=1)
  return str(path)


def documents() -> list[str]:
  """The bundled corpus's documents, each its text with a closing blank
  line."""
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    text = f.read()
  return [d.strip("\n") + "\n\n" for d in text.split("\n\n") if d.strip()]


def build_corpus(directory: pathlib.Path, size_mb: float, file_mb: float
                 ) -> tuple[int, int]:
  """Writes ~size_mb MB of distinct documents into files of ~file_mb MB;
  returns (files, bytes)."""
  docs = documents()
  directory.mkdir(parents=True)
  target, per_file = size_mb * 1e6, file_mb * 1e6
  written, files, copy = 0, 0, 0
  out, held = None, 0
  while written < target:
    for d, doc in enumerate(docs):
      if out is None:
        out = open(directory / f"part-{files:05d}.txt", "w",
                   encoding="utf-8")
        files += 1
      data = f"Copy {copy} of address {d}.\n{doc}".encode("utf-8")
      out.write(data.decode("utf-8"))
      written += len(data)
      held += len(data)
      if held >= per_file:
        out.close()
        out, held = None, 0
      if written >= target:
        break
    copy += 1
  if out is not None:
    out.close()
  return files, written


def run_hosts(corpus: pathlib.Path, out: pathlib.Path, spm: str,
              processes: int, workers: int, args) -> dict:
  """P hosts at once; per-host wall time, counts and peak RSS."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
  procs, starts = [], []
  for i in range(processes):
    cmd = [sys.executable, "-c", _WRAPPER, f"--input={corpus}/part-*.txt",
           f"--tokenizer={spm}", f"--output_dir={out}",
           f"--max_seq_length={args.max_seq_length}",
           f"--docs_per_block={args.docs_per_block}", "--unit_mb=1e-6",
           f"--num_workers={workers}", f"--process_index={i}",
           f"--process_count={processes}"]
    starts.append(time.perf_counter())
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
  hosts = []
  for i, proc in enumerate(procs):
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - starts[i]
    if proc.returncode != 0:
      raise RuntimeError(f"host {i} failed:\n{stderr[-2000:]}")
    rss = [line.split() for line in stdout.splitlines()
           if line.startswith("RSS ")][-1]
    hosts.append({"wall_s": wall, "rss_main_mb": int(rss[1]) / 1024,
                  "rss_worker_mb": int(rss[2]) / 1024 if workers > 1
                  else None, "cpu_s": float(rss[3]) + float(rss[4]),
                  "documents": 0, "bytes": 0, "instances": 0})
  sizes = {p.name: p.stat().st_size for p in corpus.glob("part-*.txt")}
  for path in sorted((out / "units").glob("unit-*.json")):
    record = json.loads(path.read_text(encoding="utf-8"))
    host = hosts[record["unit"] % processes]
    host["documents"] += record["read"]["documents"]
    host["instances"] += sum(s["instances"]
                             for s in record["splits"].values())
    host["bytes"] += sizes[f"part-{record['unit']:05d}.txt"]
  return {"hosts": hosts}


def summarise(size_mb, processes, workers, result) -> dict:
  hosts = result["hosts"]
  wall = max(h["wall_s"] for h in hosts)
  per_host = {k: sum(h[k] / h["wall_s"] for h in hosts) / len(hosts)
              for k in ("documents", "bytes", "instances")}
  return {
      "size_mb": size_mb, "processes": processes, "workers": workers,
      "wall_s": round(wall, 2),
      "docs_per_s_host": round(per_host["documents"], 1),
      "docs_per_s_worker": round(per_host["documents"] / workers, 1),
      "mb_per_s_host": round(per_host["bytes"] / 1e6, 3),
      "mb_per_s_worker": round(per_host["bytes"] / 1e6 / workers, 3),
      "inst_per_s_host": round(per_host["instances"], 0),
      "inst_per_s_worker": round(per_host["instances"] / workers, 0),
      "mb_per_s_total": round(sum(h["bytes"] for h in hosts) / 1e6 / wall,
                              3),
      # Text per CPU-second: what one core does, however many processes
      # shared the machine's cores.
      "mb_per_cpu_s": round(sum(h["bytes"] for h in hosts) / 1e6
                            / sum(h["cpu_s"] for h in hosts), 3),
      "cpu_s": round(sum(h["cpu_s"] for h in hosts), 1),
      "peak_rss_main_mb": round(max(h["rss_main_mb"] for h in hosts), 1),
      "peak_rss_worker_mb": (round(max(h["rss_worker_mb"] for h in hosts),
                                   1) if workers > 1 else None),
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", type=float, nargs="+", default=[10, 30, 100],
                 help="corpus sizes in MB of text")
  p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 3])
  p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
  p.add_argument("--file_mb", type=float, default=2.0,
                 help="MB of text per input file (= per unit of work)")
  p.add_argument("--max_seq_length", type=int, default=128)
  p.add_argument("--docs_per_block", type=int, default=2000)
  p.add_argument("--workdir", default=None,
                 help="where corpora and outputs go (default: a temp dir, "
                 "removed after)")
  p.add_argument("--json", default=None, help="also write rows here")
  args = p.parse_args(argv)
  spm = tokenizer()
  root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="prep_scale_"))
  rows = []
  header = (f"{'MB':>6} {'P':>2} {'W':>2} {'wall s':>8} {'docs/s/host':>11} "
            f"{'docs/s/wkr':>10} {'MB/s/host':>9} {'MB/s/wkr':>8} "
            f"{'inst/s/host':>11} {'inst/s/wkr':>10} {'MB/s all':>8} "
            f"{'CPU s':>7} {'MB/CPUs':>7} "
            f"{'RSS main':>8} {'RSS wkr':>7} {'load':>9}")
  print(header, flush=True)
  try:
    for size in args.sizes:
      corpus = root / f"corpus_{size:g}"
      if not corpus.exists():
        build_corpus(corpus, size, args.file_mb)
      for processes in args.processes:
        for workers in args.workers:
          out = root / f"out_{size:g}_{processes}_{workers}"
          shutil.rmtree(out, ignore_errors=True)
          load = os.getloadavg()[0]
          row = summarise(size, processes, workers,
                          run_hosts(corpus, out, spm, processes, workers,
                                    args))
          # The machine's 1-minute load average before and after: on shared
          # cores it says how much of a core each process really had.
          row["load_before"] = round(load, 1)
          row["load_after"] = round(os.getloadavg()[0], 1)
          shutil.rmtree(out, ignore_errors=True)
          rows.append(row)
          wkr = row["peak_rss_worker_mb"]
          print(f"{size:>6g} {processes:>2} {workers:>2} {row['wall_s']:>8.1f} "
                f"{row['docs_per_s_host']:>11.1f} "
                f"{row['docs_per_s_worker']:>10.1f} "
                f"{row['mb_per_s_host']:>9.3f} {row['mb_per_s_worker']:>8.3f} "
                f"{row['inst_per_s_host']:>11.0f} "
                f"{row['inst_per_s_worker']:>10.0f} "
                f"{row['mb_per_s_total']:>8.3f} "
                f"{row['cpu_s']:>7.1f} {row['mb_per_cpu_s']:>7.3f} "
                f"{row['peak_rss_main_mb']:>8.0f} "
                f"{'-' if wkr is None else f'{wkr:.0f}':>7} "
                f"{row['load_before']:>4.1f}/{row['load_after']:<4.1f}",
                flush=True)
      if not args.workdir:
        shutil.rmtree(corpus, ignore_errors=True)
  finally:
    if not args.workdir:
      shutil.rmtree(root, ignore_errors=True)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"date": datetime.datetime.now(datetime.timezone.utc)
                 .isoformat(timespec="seconds"),
                 "machine": platform.platform(), "cpus": os.cpu_count(),
                 "argv": sys.argv, "rows": rows}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
