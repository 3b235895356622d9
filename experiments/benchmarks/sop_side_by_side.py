r"""Sentence order, side by side: albert_jax against transformers' ALBERT.

Both models start from the same weights and train on the same batches (this
project's prepared SOP instances and masks) with the same recipe; the table
shows held-out SOP and MLM accuracy of each every `--eval_every` steps, and
the largest difference between their training losses so far.

- albert_jax: the trainer's own pieces (`run_spec.run_spec`,
  `optimizer.make`, `step.make_train_step`), as `python -m albert_jax.main`
  runs them.
- reference: transformers' `AlbertForPreTraining` (torch), with the official
  loss (MLM mean over masked positions + SOP mean) and a line-for-line torch
  port of google-research/albert's `LAMBOptimizer` / `AdamWeightDecay
  Optimizer` (no bias correction; LayerNorm and biases excluded from weight
  decay and, for LAMB, from the trust ratio; global-norm clipping at 1.0;
  linear warmup overriding a polynomial decay from step 0).

The corpus is synthetic and its sentence order is written in the text: each
document's k-th sentence starts with the k-th of 40 "rank" words, so a pair
is in order exactly when its first segment holds the lower rank.

  python experiments/benchmarks/sop_side_by_side.py                    # LAMB 2e-3, 500 steps
  python experiments/benchmarks/sop_side_by_side.py --optimizer=adamw --learning_rate=1e-3
  python experiments/benchmarks/sop_side_by_side.py --init=hf          # start from HF's init
  python experiments/benchmarks/sop_side_by_side.py --bias_correction  # Adam's, on both sides

Results and what they mean are in REPRODUCTION.md ("Sentence order").
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# pylint: disable=g-import-not-at-top,wrong-import-position
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from albert_jax import config_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import pipeline
from albert_jax.interop import hf
from albert_jax.interop import hf_config
from albert_jax.model.config import ModelConfig
from albert_jax.text import run_tokenizer
from albert_jax.training import optimizer as optim
from albert_jax.training import run_spec
from albert_jax.training import step as step_lib
# pylint: enable=g-import-not-at-top,wrong-import-position

EXCLUDE = re.compile(optim.EXCLUDE_PATTERN)


def rank_words(seed: int = 0) -> tuple[list[str], list[str]]:
  """(40 rank words, 200 filler words): disjoint pronounceable syllables."""
  r = random.Random(seed)
  words = [f"{c}{v}{d}" for c in "bcdfgklmnprst" for v in "aeiou"
           for d in "lnrst"]
  r.shuffle(words)
  return words[:40], words[40:240]


def write_corpus(path: str, num_docs: int = 3000, seed: int = 0) -> None:
  """Documents of 6-12 sentences; sentence k opens with rank word k."""
  ranks, filler = rank_words(seed)
  r = random.Random(seed)
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(num_docs):
      sentences = [" ".join([ranks[k].capitalize()]
                            + r.choices(filler, k=r.randint(4, 9))) + "."
                   for k in range(r.randint(6, 12))]
      f.write("\n".join(sentences) + "\n\n")


def config(corpus: str, *, steps: int, optimizer: str, learning_rate: float,
           batch_size: int = 64, seq_len: int = 64, hidden: int = 128,
           layers: int = 4, vocab_size: int = 224, seed: int = 0):
  """The recipe both sides train with (a ConfigDict as main reads it)."""
  model = config_lib.model_config(
      vocab_size=vocab_size, embedding_size=hidden // 2, hidden_size=hidden,
      num_hidden_layers=layers, num_attention_heads=4,
      intermediate_size=4 * hidden, max_position_embeddings=seq_len,
      hidden_act="gelu_new", share="all")
  c = config_lib.base_config(
      model, batch_size=batch_size, num_train_steps=steps,
      warmup_steps=max(steps // 10, 1), learning_rate=learning_rate,
      max_seq_length=seq_len, max_predictions=10, optimizer=optimizer)
  c.data.corpus = corpus
  c.data.dupe_factor = 2
  c.data.eval_fraction = 0.05
  c.data.dynamic_masking = False
  c.seed = seed
  return c


class OfficialOptimizer:
  """google-research/albert's LAMBOptimizer (lamb=True) or
  AdamWeightDecayOptimizer (lamb=False), with create_optimizer's schedule
  and clipping, for a torch module's named parameters."""

  def __init__(self, named_params, *, peak: float, num_train_steps: int,
               warmup_steps: int, lamb: bool, weight_decay: float = 0.01,
               clip_norm: float = 1.0, bias_correction: bool = False):
    self.params = list(named_params)
    self.state = {n: (torch.zeros_like(p), torch.zeros_like(p))
                  for n, p in self.params}
    self.peak, self.total, self.warmup = peak, num_train_steps, warmup_steps
    self.lamb, self.wd, self.clip = lamb, weight_decay, clip_norm
    # The official code has none; True is Adam's (the config's
    # optimizer.bias_correction).
    self.bias_correction, self.count = bias_correction, 0

  def learning_rate(self, step: int) -> float:
    decayed = self.peak * (1.0 - min(step, self.total) / self.total)
    if step < self.warmup:
      return self.peak * step / self.warmup
    return decayed

  @torch.no_grad()
  def step(self, step: int) -> None:
    grads = {n: p.grad for n, p in self.params if p.grad is not None}
    norm = torch.sqrt(sum(torch.sum(g * g) for g in grads.values()))
    scale = min(1.0, self.clip / float(norm)) if float(norm) > 0 else 1.0
    lr = self.learning_rate(step)
    self.count += 1
    c1, c2 = ((1 - 0.9 ** self.count, 1 - 0.999 ** self.count)
              if self.bias_correction else (1.0, 1.0))
    for name, p in self.params:
      if name not in grads:
        continue
      g = grads[name] * scale
      m, v = self.state[name]
      m.mul_(0.9).add_(0.1 * g)
      v.mul_(0.999).add_(0.001 * g * g)
      update = (m / c1) / (torch.sqrt(v / c2) + 1e-6)
      excluded = EXCLUDE.search(name) is not None
      if not excluded:
        update = update + self.wd * p
      ratio = 1.0
      if self.lamb and not excluded:
        w_norm, u_norm = torch.linalg.norm(p), torch.linalg.norm(update)
        if w_norm > 0 and u_norm > 0:
          ratio = float(w_norm / u_norm)
      p.sub_(ratio * lr * update)


def reference_loss(model, batch) -> tuple[torch.Tensor, dict[str, float]]:
  """The official pre-training loss of an HF AlbertForPreTraining on one of
  this project's batches, and its MLM/SOP metrics."""
  t = {k: torch.as_tensor(np.asarray(v)) for k, v in batch.items()}
  out = model(input_ids=t["input_ids"].long(),
              token_type_ids=t["token_type_ids"].long(),
              attention_mask=t["attention_mask"].long())
  b, p = t["masked_ids"].shape
  logits = out.prediction_logits[torch.arange(b)[:, None],
                                 t["masked_positions"].long()]
  per = torch.nn.functional.cross_entropy(
      logits.reshape(b * p, -1), t["masked_ids"].long().reshape(-1),
      reduction="none").reshape(b, p)
  w = t["masked_weights"].float()
  mlm = torch.sum(per * w) / (torch.sum(w) + 1e-5)
  labels = t["sentence_labels"].long()
  sop = torch.nn.functional.cross_entropy(out.sop_logits, labels)
  metrics = {
      "mlm_loss": mlm.item(), "sop_loss": sop.item(),
      "mlm_accuracy": float(torch.sum((logits.argmax(-1) == t["masked_ids"])
                                      * w) / torch.sum(w)),
      "sop_accuracy": float(torch.mean(
          (out.sop_logits.argmax(-1) == labels).float()))}
  return mlm + sop, metrics


class SideBySide:
  """albert_jax and the HF reference, from the same weights, stepped on the
  same batches."""

  def __init__(self, c, workdir: str, init: str = "albert_jax",
               compiler_options: dict | None = None):
    tokenizer = run_tokenizer.ensure(c.data, workdir,
                                     vocab_size=c.model.vocab_size,
                                     seed=c.seed)
    data_dir = pipeline.ensure_dataset(c.data, workdir, tokenizer,
                                       seed=c.seed)
    vocab = loader_lib.Vocabulary.from_tokenizer(tokenizer)

    def loader(split, seed):
      return loader_lib.Loader(
          data_dir, split, global_batch_size=c.batch_size, vocab=vocab,
          seed=seed, masking_config=pipeline.masking_config(c.masking),
          dynamic_masking=False, process_index=0, process_count=1,
          prefetch=0)
    self.train = loader("train", c.seed)
    self.eval = loader("eval", c.seed + 1)
    cfg = ModelConfig.from_dict(c.model)
    run = run_spec.run_spec(c)
    hf_cfg = transformers.AlbertConfig(**hf_config.config_to_hf(
        cfg, "albert", "AlbertForPreTraining"))
    hf_cfg.classifier_dropout_prob = 0.0  # albert_jax's SOP head has none
    torch.manual_seed(c.seed)
    self.reference = transformers.AlbertForPreTraining(hf_cfg)
    if init == "hf":
      params, _ = hf.params_from_hf(
          {k: v.detach().numpy()
           for k, v in self.reference.state_dict().items()}, cfg)
    else:
      params = nn.meta.unbox(run.init_params(jax.random.key(c.seed)))
      state = hf.params_to_hf(jax.tree.map(np.asarray, params), cfg,
                              architecture="AlbertForPreTraining")
      self.reference.load_state_dict(
          {k: torch.as_tensor(np.array(v)) for k, v in state.items()},
          strict=False)
      self.reference.tie_weights()
    tx, schedule = optim.make(c.optimizer, c.num_train_steps)
    self.objective = run.objective
    self.step_fn = jax.jit(
        step_lib.make_train_step(run.objective, tx, schedule),
        compiler_options=compiler_options)
    self.eval_fn = jax.jit(step_lib.make_eval_step(run.objective),
                           compiler_options=compiler_options)
    self.state = {"step": jnp.zeros([], jnp.int32), "params": params,
                  "opt_state": tx.init(params),
                  "rng": jax.random.key_data(jax.random.key(0))}
    o = c.optimizer
    self.optimizer = OfficialOptimizer(
        self.reference.named_parameters(), peak=o.learning_rate,
        num_train_steps=c.num_train_steps, warmup_steps=o.warmup_steps,
        lamb=o.name == "lamb", weight_decay=o.weight_decay,
        clip_norm=o.clip_norm, bias_correction=o.bias_correction)

  def step(self, step: int) -> tuple[float, float]:
    """One training step of both; their training losses."""
    batch = self.train.local_batch(step)
    self.state, metrics = self.step_fn(self.state, batch)
    self.reference.train()
    for _, p in self.optimizer.params:
      p.grad = None
    loss, _ = reference_loss(self.reference, batch)
    loss.backward()
    self.optimizer.step(step)
    return float(metrics["loss"]), loss.item()

  def evaluate(self, num_batches: int) -> tuple[dict, dict]:
    """Held-out metrics of (albert_jax, reference)."""
    total, ref = None, {}
    self.reference.eval()
    for i in range(num_batches):
      batch = self.eval.local_batch(i)
      sums = jax.device_get(self.eval_fn(self.state["params"], batch))
      total = sums if total is None else jax.tree.map(np.add, total, sums)
      with torch.no_grad():
        _, m = reference_loss(self.reference, batch)
      for k, v in m.items():
        ref[k] = ref.get(k, 0.0) + v / num_batches
    ours = {k: float(v) for k, v in self.objective.metrics(
        jax.tree.map(jnp.asarray, total)).items()}
    return ours, ref


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, default=500)
  p.add_argument("--optimizer", default="lamb", choices=("lamb", "adamw"))
  p.add_argument("--learning_rate", type=float, default=2e-3)
  p.add_argument("--init", default="albert_jax", choices=("albert_jax", "hf"))
  p.add_argument("--bias_correction", action="store_true",
                 help="Adam's bias correction on both sides (the official "
                 "recipe has none).")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--eval_every", type=int, default=50)
  p.add_argument("--eval_batches", type=int, default=6)
  p.add_argument("--workdir", default=os.path.join(
      os.environ.get("TMPDIR", "/tmp"), "albert_jax_sop_side_by_side"))
  a = p.parse_args()
  torch.set_num_threads(1)
  os.makedirs(a.workdir, exist_ok=True)
  corpus = os.path.join(a.workdir, "corpus.txt")
  if not os.path.exists(corpus):
    write_corpus(corpus)
  c = config(corpus, steps=a.steps, optimizer=a.optimizer,
             learning_rate=a.learning_rate, seed=a.seed)
  c.optimizer.bias_correction = a.bias_correction
  run = SideBySide(c, a.workdir, a.init)
  print(f"{a.optimizer} lr {a.learning_rate}"
        f"{' with bias correction' if a.bias_correction else ''}, "
        f"{a.steps} steps, batch "
        f"{c.batch_size}, seq {c.data.max_seq_length}, init {a.init}, seed "
        f"{a.seed}\n")
  print("| step | SOP acc albert_jax | SOP acc reference | MLM acc albert_jax "
        "| MLM acc reference | max abs Δ train loss so far |")
  print("|---:|---:|---:|---:|---:|---:|")
  worst, start = 0.0, time.time()
  for step in range(a.steps + 1):
    if step % a.eval_every == 0 or step == a.steps:
      ours, ref = run.evaluate(a.eval_batches)
      print(f"| {step} | {ours['sop_accuracy']:.3f} | "
            f"{ref['sop_accuracy']:.3f} | {ours['mlm_accuracy']:.3f} | "
            f"{ref['mlm_accuracy']:.3f} | {worst:.2e} |", flush=True)
    if step < a.steps:
      ours_loss, ref_loss = run.step(step)
      worst = max(worst, abs(ours_loss - ref_loss))
  print(f"\n{time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
