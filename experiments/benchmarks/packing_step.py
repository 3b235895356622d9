r"""Real tokens/s of the demo model's loss and gradient, unpacked against
packed batches, timed in alternating rounds so that the load of a shared
machine falls on both alike.

Reads the first 8 train batches of each prepared directory (the `data/`
of a demo run with `--config.data.pack=0` and one with `=3`), compiles
the forward and backward of `configs/demo.py`'s model on each, then times
6 rounds of (8 unpacked batches, 8 packed batches) and prints each side's
median time per batch and real (non-pad) tokens per second.

  python experiments/benchmarks/packing_step.py \
      --tokenizer=W0/spm/spiece.model --prepared=W0/data,W3/data
"""

import argparse
import importlib.util
import time

import jax
import numpy as np

from albert_jax.data import loader as loader_lib
from albert_jax.data import pipeline
from albert_jax.text.tokenizer import Tokenizer
from albert_jax.training import objectives
from albert_jax.training import run_spec

ROUNDS, BATCHES = 6, 8


def _demo_config(pack: int):
  spec = importlib.util.spec_from_file_location("demo", "configs/demo.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("finetune_steps=0")
  c.data.pack = pack
  return c


def _setup(pack: int, data_dir: str, vocab):
  c = _demo_config(pack)
  spec = run_spec.run_spec(c)
  params = jax.tree.map(
      lambda x: x.value if hasattr(x, "value") else x,
      jax.jit(spec.init_params)(jax.random.key(0)),
      is_leaf=lambda x: hasattr(x, "value"))
  loader = pipeline.make_loader(c.data, c.masking, data_dir, "train", vocab,
                                None, global_batch_size=c.batch_size,
                                seed=c.seed)
  batches = [loader.local_batch(s) for s in range(BATCHES)]
  objective = spec.objective

  def loss(p, b):
    sums = objective.sums(p, b, None, True)
    return objectives.loss(sums, objective.denominators(b)), sums

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  jax.block_until_ready(step(params, batches[0]))
  return step, params, batches


def main():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--tokenizer", required=True)
  p.add_argument("--prepared", required=True, help="UNPACKED_DIR,PACKED_DIR")
  args = p.parse_args()
  vocab = loader_lib.Vocabulary.from_tokenizer(
      Tokenizer.from_file(args.tokenizer))
  runs = {pack: _setup(pack, d, vocab)
          for pack, d in zip((0, 3), args.prepared.split(","))}
  times = {pack: [] for pack in runs}
  for _ in range(ROUNDS):
    for pack, (step, params, batches) in runs.items():
      start = time.perf_counter()
      for b in batches:
        jax.block_until_ready(step(params, b))
      times[pack].append((time.perf_counter() - start) / len(batches))
  for pack, (_, _, batches) in runs.items():
    real = np.mean([np.mean(b["attention_mask"] > 0) for b in batches])
    rows, length = batches[0]["input_ids"].shape
    median = float(np.median(times[pack]))
    instances = np.mean([(b["sentence_labels"] >= 0).sum() for b in batches])
    print(f"pack={pack}: real-token share {real:.4f}, median "
          f"{1e3 * median:.0f} ms per batch of {rows}x{length} (rounds: "
          f"{', '.join(f'{1e3 * t:.0f}' for t in times[pack])}), real "
          f"tokens/s {rows * length * real / median:.0f}, instances/batch "
          f"{instances:.1f}")


if __name__ == "__main__":
  main()
