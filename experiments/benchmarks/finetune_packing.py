r"""Fine-tuning with packed rows against one example a row: real examples/s.

The demo's fine-tuning shape (its ALBERT: hidden 128, 4 layers, seq 128; 32
rows a step, AdamW) on a bundled labelled file (`--task source`: which
corpus a sentence comes from, `spam`: SpamAssassin e-mails), its training
rows featurized as the files task does, then the same jitted train step
(`finetune.run`'s: `FineTuneSpec`, `TaskObjective`, `make_train_step`) timed
on batches of one example a row and of up to K (`--pack`, default 8)
examples a row, taking turns. `--task short` is a file of texts as short as
a GLUE single-sentence task's (SST-2 and CoLA sentences run to a few dozen
words): the bundled corpus's sentences, each cut to 3-25 words, labelled
with their corpus. Reported per layout: padding share of the
batches, ms a step, rows/s and real examples/s, and the speed-up in
examples/s. Then the same for prediction (the eval step on all rows).

The model starts from random weights: a step's time does not depend on
them. The vocabulary is a 5000-piece SentencePiece model trained on the
bundled corpus as the demo trains it (`--tokenizer` to give one).

  python experiments/benchmarks/finetune_packing.py --task source
  python experiments/benchmarks/finetune_packing.py --task short
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import os
import platform
import statistics
import tempfile
import time

import jax
import numpy as np

from albert_jax import config_lib
from albert_jax import data as data_lib
from albert_jax import sharding as sharding_lib
from albert_jax.finetune import batching
from albert_jax.finetune import data_files
from albert_jax.finetune import packing
from albert_jax.finetune import registry
from albert_jax.finetune import spec as spec_lib
from albert_jax.finetune.task import TaskObjective
from albert_jax.model.config import ModelConfig
from albert_jax.text import train_tokenizer as train_lib
from albert_jax.text import documents
from albert_jax.text.tokenizer import Tokenizer
from albert_jax.training import optimizer as optim
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

TASKS = {"source": "bundled/labeled/corpus_source.tsv.gz",
         "spam": "bundled/labeled/spam_assassin.tsv.gz",
         "short": None}  # written by `_short_file`
SHORT_PER_CORPUS = 1000  # sentences of each bundled corpus in `short`


def _tokenizer(path: str | None, workdir: str) -> Tokenizer:
  if path:
    return Tokenizer.from_file(path)
  corpus = documents.expand_paths(documents.corpus_pattern("bundled"))
  return train_lib.train(corpus, 5000, output=os.path.join(
      workdir, "spiece.model"), num_threads=os.cpu_count() or 1)


def _short_file(workdir: str) -> str:
  """`--task short`'s file: from each bundled corpus, its first
  SHORT_PER_CORPUS sentences of 3 or more words, each cut to 3-25 words
  (uniform, seeded), labelled with the corpus's name."""
  rng = np.random.default_rng(0)
  path = os.path.join(workdir, "short.tsv")
  with open(path, "w", encoding="utf-8", newline="") as f:
    out = csv.writer(f, delimiter="\t", lineterminator="\n")
    out.writerow(["text", "label"])
    for corpus in documents.expand_paths(documents.corpus_pattern("bundled")):
      label = os.path.basename(corpus).split(".")[0]
      taken = 0
      with gzip.open(corpus, "rt", encoding="utf-8") as lines:
        for line in lines:
          words = line.split()
          if len(words) < 3:
            continue
          out.writerow([" ".join(words[:rng.integers(3, 26)]), label])
          taken += 1
          if taken == SHORT_PER_CORPUS:
            break
  return path


def _task(name: str, workdir: str):
  """The files task on the whole labelled file (all rows train)."""
  source = (_short_file(workdir) if name == "short" else
            os.path.join(os.path.dirname(data_lib.__file__), TASKS[name]))
  parts = data_files.split_file(source, os.path.join(workdir, "split"),
                                (0.98, 0.01, 0.01))
  data = {"train_file": parts["train"]["path"],
          "eval_file": parts["eval"]["path"],
          "text_column": "text", "label_column": "label"}
  return registry.make_task("files", data)


def _model_config(vocab_size: int) -> ModelConfig:
  return ModelConfig.from_dict(config_lib.model_config(
      vocab_size=vocab_size, embedding_size=64, hidden_size=128,
      num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
      max_position_embeddings=128, hidden_act="gelu_new", share="all"))


def _runner(task, cfg, seq, pack, batch, features, mesh, rules):
  """(train step fn over a step index, eval fn over all rows, rows, examples
  per step on average, padding share)."""
  config = config_lib.classify_config(
      learning_rate=1e-4, batch_size=batch, num_train_steps=1000,
      warmup_steps=10, max_seq_length=seq)
  spec = spec_lib.for_task(task, cfg, seq, pack=pack)
  objective = TaskObjective(spec.model, task)
  tx, schedule = optim.make(config.optimizer, config.num_train_steps)
  state, shardings = state_lib.create_state(
      state_lib.state_init_fn(spec.init_params, tx), tx, mesh, rules,
      jax.random.key(0))
  train = step_lib.jit_train_step(
      step_lib.make_train_step(objective, tx, schedule), shardings, mesh,
      rules)
  rows = packing.pack(features, pack) if pack else features
  data_sharding = sharding_lib.data_sharding(mesh)
  batches = batching.ArrayBatches(rows, batch, sharding=data_sharding)
  holder = {"state": state}

  def step(i):
    with sharding_lib.in_mesh(mesh, rules):
      holder["state"], m = train(holder["state"], batches.train_batch(i))
    return m

  predict = jax.jit(lambda p, b: task.predict(
      objective.outputs(p, b, None, True), b))

  def evaluate():
    with sharding_lib.in_mesh(mesh, rules):
      out = [predict(holder["state"]["params"], b)
             for b in batches.eval_batches()]
    jax.block_until_ready(out)

  per_row = len(features["input_ids"]) / len(rows["input_ids"])
  return step, evaluate, len(rows["input_ids"]), per_row, (
      packing.padding_fraction(rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--task", choices=sorted(TASKS), default="source")
  p.add_argument("--pack", type=int, default=8)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--tokenizer", default=None)
  args = p.parse_args(argv)
  packing.check_pack(args.pack)
  with tempfile.TemporaryDirectory() as workdir:
    tok = _tokenizer(args.tokenizer, workdir)
    task = _task(args.task, workdir)
    split = task.load(task.train_split, tok, args.seq)
  cfg = _model_config(tok.vocab_size)
  base = config_lib.base_config(config_lib.tiny_model(),
                                batch_size=args.batch)
  mesh, rules = sharding_lib.mesh_and_rules(base.mesh, base.sharding_rules)
  layouts = {"one a row": 0, f"up to {args.pack} a row": args.pack}
  runners = {name: _runner(task, cfg, args.seq, k, args.batch,
                           split.features, mesh, rules)
             for name, k in layouts.items()}
  for step, *_ in runners.values():
    for i in range(args.warmup):
      jax.block_until_ready(step(i))
  times = {name: [] for name in runners}
  for i in range(args.steps):
    for name, (step, *_) in runners.items():
      start = time.perf_counter()
      jax.block_until_ready(step(args.warmup + i))
      times[name].append(time.perf_counter() - start)
  evals = {}
  for name, (_, evaluate, *_) in runners.items():
    evaluate()  # compiles
    start = time.perf_counter()
    evaluate()
    evals[name] = time.perf_counter() - start
  print(f"# {datetime.datetime.now().isoformat(timespec='seconds')} | "
        f"{platform.processor() or platform.machine()} "
        f"({len(os.sched_getaffinity(0))} CPUs) | jax {jax.__version__} | "
        f"load {os.getloadavg()} | task {args.task}: {split.num_rows} "
        f"training rows, seq {args.seq}, batch {args.batch} rows")
  print("\n| layout | rows | examples a row | padding | ms a step | rows/s "
        "| examples/s | vs one a row | eval s (all rows) | eval examples/s |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  base = None
  for name, (_, _, rows, per_row, padding) in runners.items():
    ms = statistics.median(times[name]) * 1e3
    examples = args.batch * per_row / ms * 1e3
    base = base or examples
    print(f"| {name} | {rows} | {per_row:.2f} | {100 * padding:.1f}% | "
          f"{ms:.1f} | {args.batch / ms * 1e3:.1f} | {examples:.1f} | "
          f"{examples / base:.2f}× | {evals[name]:.2f} | "
          f"{split.num_rows / evals[name]:.1f} |")


if __name__ == "__main__":
  main()
