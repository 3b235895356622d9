r"""Sentence order on the counting corpus: which ingredient makes the
official LAMB learn it (REPRODUCTION.md, "Sentence order on the
counting corpus").

albert_jax's model, masked-LM objective and official LAMB, trained on the
loop of ../shared/tools/sop_reference/sop_reference_torch.py: a prepared
albert_jax workdir's train instances read by the Loader with data seed
`--data_seed` (the reference always uses 0), batch 64, 20 predictions,
held-out SOP on 8 eval batches (loader seed 1). One ingredient at a time
can be moved to the reference's side:

  --init trunc    the model's own initialiser (truncated normal, seed --seed)
  --init normal   every kernel and embedding table redrawn from N(0, std²)
                  (the distribution model.initializer="normal" draws)
  --init hf       transformers' AlbertForPreTraining initial weights
                  (torch.manual_seed(--seed)), converted
  --sched aj|ref  albert_jax's schedule (polynomial decay from step 0,
                  warmup on top) or the reference's (warmup, then linear
                  decay from the peak)
  --exclude RE    the LAMB exclusion list (default: the official one)

  python experiments/benchmarks/sop_init_bisect.py WORKDIR --seed 1 \
      --init normal --stop 300 --eval_every 300
"""
import argparse
import importlib.util
import pathlib
import re
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from albert_jax import tree as tree_lib
from albert_jax.data import loader as L
from albert_jax.data import masking
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig
from albert_jax.text.tokenizer import Tokenizer
from albert_jax.training import objectives
from albert_jax.training import optimizer as optim

p = argparse.ArgumentParser()
p.add_argument("workdir"); p.add_argument("--steps", type=int, default=1000)
p.add_argument("--seed", type=int, default=0); p.add_argument("--data_seed", type=int, default=0)
p.add_argument("--init", default="trunc", choices=("trunc", "normal", "hf"))
p.add_argument("--sched", default="aj", choices=("aj", "ref"))
p.add_argument("--lr", type=float, default=2e-3)
p.add_argument("--std", type=float, default=0.02)
p.add_argument("--eval_every", type=int, default=250)
p.add_argument("--stop", type=int, default=0)
p.add_argument("--exclude", default=optim.EXCLUDE_PATTERN)
a = p.parse_args()
w = a.workdir
tok = Tokenizer.from_file(f"{w}/spm/spiece.model")
voc = L.Vocabulary.from_tokenizer(tok)
mc = masking.MaskingConfig(max_predictions=20)
tr = L.Loader(f"{w}/data", "train", global_batch_size=64, vocab=voc, seed=a.data_seed, masking_config=mc, prefetch=0)
ev = L.Loader(f"{w}/data", "eval", global_batch_size=64, vocab=voc, seed=1, masking_config=mc, prefetch=0)
TINY = pathlib.Path(__file__).resolve().parents[2] / "configs" / "tiny.py"
spec = importlib.util.spec_from_file_location("tiny", TINY)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
c = mod.get_config("layers=4")
c.model.vocab_size = voc.size; c.model.hidden_size = 128; c.model.intermediate_size = 512
c.model.initializer_range = a.std
cfg = ModelConfig.from_dict(c.model.to_dict())
model = albert_lib.Albert(cfg)
params = nn.meta.unbox(model.init(jax.random.key(a.seed), jnp.zeros((1, 8), jnp.int32))["params"])
paths = tree_lib.paths(params)
if a.init == "normal":
  keys = jax.random.split(jax.random.key(a.seed + 1000), len(jax.tree.leaves(params)))
  it = iter(keys)
  params = jax.tree.map(lambda p_, n: a.std * jax.random.normal(next(it), p_.shape) if re.search(r"(kernel|embedding)$", n) else p_, params, paths)
elif a.init == "hf":
  import torch
  from transformers import AlbertConfig, AlbertForPreTraining
  from albert_jax.interop import hf
  torch.manual_seed(a.seed)
  hcfg = AlbertConfig(vocab_size=voc.size, embedding_size=32, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=512, hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      max_position_embeddings=128, classifier_dropout_prob=0.0, initializer_range=0.02)
  m = AlbertForPreTraining(hcfg)
  st = {k: v.detach().numpy() for k, v in m.state_dict().items()}
  hp, _ = hf.params_from_hf(st, cfg)
  jax.tree.map(lambda x, y: None if x.shape == y.shape else sys.exit(f"shape {x.shape} {y.shape}"), params, hp)
  params = jax.tree.map(jnp.asarray, hp)
c.num_train_steps = a.steps; c.optimizer.learning_rate = a.lr; c.optimizer.warmup_steps = a.steps // 10
tx, schedule = optim.make(c.optimizer, c.num_train_steps)
if a.exclude != optim.EXCLUDE_PATTERN:
  tx = optax.chain(optax.clip_by_global_norm(1.0), optim.lamb(schedule, exclude=a.exclude))
if a.sched == "ref":
  warm = a.steps // 10
  def schedule(s):
    s = jnp.asarray(s, jnp.float32)
    return jnp.where(s < warm, a.lr * (s + 1) / warm, a.lr * jnp.maximum(0.0, (a.steps - s) / (a.steps - warm)))
  tx = optax.chain(optax.clip_by_global_norm(1.0), optim.lamb(schedule, exclude=a.exclude))
obj = objectives.MaskedLMObjective(model, right_padded=True)
def lossf(p_, b):
  sums = obj.sums(p_, b, None, True)
  return objectives.loss(sums, obj.denominators(b)), sums
@jax.jit
def train(p_, o, b):
  (l, sums), g = jax.value_and_grad(lossf, has_aux=True)(p_, b)
  u, o = tx.update(g, o, p_)
  return optax.apply_updates(p_, u), o, obj.metrics(sums)
@jax.jit
def evs(p_, b):
  return obj.sums(p_, b, None, True)
opt = tx.init(params)
def evaluate():
  tot = None
  for s in range(8):
    b = {k: jnp.asarray(v) for k, v in ev.local_batch(s).items()}
    x = evs(params, b); tot = x if tot is None else jax.tree.map(jnp.add, tot, x)
  mm = obj.metrics(tot); return float(mm["mlm_accuracy"]), float(mm["sop_accuracy"])
t0 = time.time()
print(vars(a), flush=True)
print('excluded:', [n for n, m_ in zip(jax.tree.leaves(paths), jax.tree.leaves(optim.path_mask(params, a.exclude))) if m_], flush=True)
for s in range(a.stop or a.steps):
  b = {k: jnp.asarray(v) for k, v in tr.local_batch(s).items()}
  params, opt, mt = train(params, opt, b)
  if (s + 1) % 100 == 0 or (s + 1) % a.eval_every == 0:
    line = f"{s+1}/{a.steps} {(s+1)/(time.time()-t0):.2f} it/s mlm {float(mt['mlm_loss']):.3f} sop {float(mt['sop_loss']):.3f} sop_acc {float(mt['sop_accuracy']):.3f}"
    if (s + 1) % a.eval_every == 0 or s + 1 == a.steps:
      em, es = evaluate(); line += f" | held-out MLM {em:.4f} SOP {es:.4f}"
    print(line, flush=True)
