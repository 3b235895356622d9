"""GPT-1 as a configuration: the causal stack, its next-token loss, the
pre-training setup, the config, the cosine schedule, and a run end to end
through `albert_jax.main` that `load_pretrained` reads back."""

import dataclasses
import functools
import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax.interop.pretrained import load_pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model import encoder as encoder_lib
from albert_jax.model import flops
from albert_jax.model import heads as heads_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives
from albert_jax.training import optimizer as optim
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS
from locations import CONFIGS
from locations import CORPUS
from locations import REPO

MOBY_DICK = CORPUS.parent / "moby_dick.txt.gz"
jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE_OPTIONS)


def gpt_config(arg="tiny"):
  spec = importlib.util.spec_from_file_location(
      "configs_gpt_small", CONFIGS / "gpt_small.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def tiny_config(seq_len=32, lr=1e-2):
  """The tiny GPT config without dropout (so steps are comparable)."""
  c = gpt_config()
  c.model.hidden_dropout_prob = c.model.attention_probs_dropout_prob = 0.0
  c.data.max_seq_length = seq_len
  c.optimizer.learning_rate = lr
  c.num_train_steps = 25
  return c


@functools.lru_cache(maxsize=None)
def tiny_setup():
  """Built once for the module: (config, RunSpec, unboxed state, jitted
  1- and 2-micro-batch train steps, jitted eval step, jitted forward of the
  model). Tests share [8, 32] batches so that each compiles once."""
  c = tiny_config()
  run = run_spec.run_spec(c)
  tx, schedule = optim.make(c.optimizer, c.num_train_steps)
  init = state_lib.state_init_fn(run.init_params, tx)

  def unboxed(rng):
    state = init(rng)
    return {**state, "params": nn.meta.unbox(state["params"])}

  state = jit(unboxed)(jax.random.key(0))
  steps = {n: jit(step_lib.make_train_step(run.objective, tx, schedule, n))
           for n in (1, 2)}
  evaluate = jit(step_lib.make_eval_step(run.objective))
  forward = jit(lambda params, ids, mask: run.objective.model.apply(
      {"params": params}, ids, attention_mask=mask))
  return c, run, state, steps, evaluate, forward


def lm_batch(ids, mask):
  """A loader-style unmasked batch from [B, T] ids and attention mask."""
  ids = jnp.asarray(ids, jnp.int32)
  b = ids.shape[0]
  return {"input_ids": ids, "token_type_ids": jnp.zeros_like(ids),
          "attention_mask": jnp.asarray(mask, jnp.int32),
          "masked_positions": jnp.zeros((b, 0), jnp.int32),
          "masked_ids": jnp.zeros((b, 0), jnp.int32),
          "masked_weights": jnp.zeros((b, 0), jnp.float32),
          "sentence_labels": jnp.full((b,), -1, jnp.int32)}


def cyclic_batch(seed=0, batch=8, length=32, period=17):
  """Rows counting through `period` symbols from random starts: each next
  token follows from the current one. Row 1 ends in padding, row 2 packs two
  sequences."""
  rng = np.random.default_rng(seed)
  ids = (rng.integers(0, period, batch)[:, None] + np.arange(length)) % (
      period) + 10
  mask = np.ones((batch, length), np.int32)
  mask[1, 20:] = 0
  mask[2, 16:] = 2
  return lm_batch(np.where(mask > 0, ids, 0), mask)


def np_next_token_sums(logits, ids, mask):
  """Hand-rolled reference: every (row, t) whose tokens t and t + 1 are real
  and of one packed sequence predicts token t + 1 from logits[row, t]."""
  logits = np.asarray(logits, np.float64)
  loss = correct = count = 0.0
  for b in range(ids.shape[0]):
    for t in range(ids.shape[1] - 1):
      if mask[b, t] == 0 or mask[b, t] != mask[b, t + 1]:
        continue
      row = logits[b, t]
      log_z = row.max() + np.log(np.sum(np.exp(row - row.max())))
      loss += log_z - row[ids[b, t + 1]]
      correct += float(np.argmax(row) == ids[b, t + 1])
      count += 1
  return loss, correct, count


# ---------------------------------------------------------------- the model


def _tiny_model(**overrides):
  cfg = ModelConfig.from_dict({**gpt_config().model.to_dict(),
                               "hidden_dropout_prob": 0.0,
                               "attention_probs_dropout_prob": 0.0,
                               **overrides})
  return cfg, albert_lib.Albert(cfg, heads=("lm",) if cfg.causal else ("mlm",))


def test_outputs_never_depend_on_later_tokens():
  """Changing tokens from position 12 on leaves every output before it, bit
  for bit; with the same weights attending both ways, everything moves."""
  _, run, state, _, _, forward = tiny_setup()
  params = state["params"]
  batch = cyclic_batch(seed=4)
  ids, mask = batch["input_ids"], batch["attention_mask"]
  rng = np.random.default_rng(0)
  later = ids.at[:, 12:].set(jnp.asarray(rng.integers(100, 999, (8, 20))))
  before, after = forward(params, ids, mask), forward(params, later, mask)
  for key in ("sequence_output", "lm_logits"):
    np.testing.assert_array_equal(before[key][:, :12], after[key][:, :12])
    assert np.abs(np.asarray(before[key][:, 12:16] - after[key][:, 12:16])
                  ).min() > 0, key
  # Row 2 packs two sequences at 16: the second never sees the first.
  earlier = ids.at[2, :16].set(jnp.asarray(rng.integers(100, 999, 16)))
  np.testing.assert_array_equal(forward(params, earlier, mask)["lm_logits"][
      2, 16:], before["lm_logits"][2, 16:])
  encoder = albert_lib.Albert(dataclasses.replace(run.model_config,
                                              causal=False), heads=())
  both_ways = jit(lambda p, i: encoder.apply({"params": p}, i,
                                             attention_mask=mask))
  moved = np.asarray(both_ways(params, ids)["sequence_output"][:, :12]
                     - both_ways(params, later)["sequence_output"][:, :12])
  assert np.abs(moved[[0, 3, 4]]).min() > 0


def test_lm_head_is_tied_and_pooler_reads_the_last_token():
  _, _, state, _, _, forward = tiny_setup()
  params = state["params"]
  batch = cyclic_batch(seed=5)
  mask = np.array(batch["attention_mask"])
  mask[3, 5:] = 0
  mask[7] = 0  # padding only: reads position 0
  out = forward(params, batch["input_ids"], jnp.asarray(mask))
  h = np.asarray(out["sequence_output"], np.float64)
  table = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
  np.testing.assert_allclose(out["lm_logits"], h @ table.T, rtol=1e-5,
                             atol=1e-5)
  assert "lm" not in params  # GPT-1's decoder is the table alone
  last = [31, 19, 31, 4, 31, 31, 31, 0]
  np.testing.assert_array_equal(encoder_lib.last_token_index(mask), last)
  pooler = params["pooler"]
  np.testing.assert_allclose(
      out["pooled_output"],
      np.tanh(h[np.arange(8), last] @ np.asarray(pooler["kernel"])
              + np.asarray(pooler["bias"])), rtol=1e-5, atol=1e-6)


class _EmbeddingsAndLMHead(nn.Module):
  """The word table and the "lm" head alone (no encoder to compile)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, hidden):
    embeddings = encoder_lib.Embeddings(self.config, name="embeddings")
    return heads_lib.LMHead(self.config, name="lm")(hidden, embeddings)


def test_factorised_embedding_maps_back_to_e_before_the_table():
  cfg, _ = _tiny_model(embedding_projection=True, embedding_size=16,
                       share="all")
  head = _EmbeddingsAndLMHead(cfg)
  hidden = jnp.asarray(np.random.default_rng(6).normal(size=(2, 3, 64)),
                       jnp.float32)
  params = jit(lambda key: nn.unbox(head.init(key, hidden)["params"]))(
      jax.random.key(2))
  logits = jit(lambda p: head.apply({"params": p}, hidden))(params)
  transform = params["lm"]["transform"]
  table = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
  assert table.shape == (cfg.vocab_size, 16)
  y = (np.asarray(hidden, np.float64) @ np.asarray(transform["kernel"])
       + np.asarray(transform["bias"]))
  np.testing.assert_allclose(logits, y @ table.T, rtol=1e-5, atol=1e-6)


def test_heads_that_do_not_fit_the_attention_are_refused():
  cfg, _ = _tiny_model()
  ids = jnp.zeros((1, 4), jnp.int32)
  with pytest.raises(ValueError, match="cannot have the 'sop' head"):
    albert_lib.Albert(cfg, heads=("mlm", "sop")).init(jax.random.key(0), ids)
  bidirectional, _ = _tiny_model(causal=False)
  with pytest.raises(ValueError, match="set model.causal=True"):
    albert_lib.Albert(bidirectional, heads=("lm",)).init(jax.random.key(0), ids)
  with pytest.raises(ValueError, match="model.causal must be true or false"):
    dataclasses.replace(cfg, causal=1)


# ----------------------------------------------------------------- the loss


def test_lm_loss_matches_numpy_on_padding_and_packed_segments():
  c, run, state, _, evaluate, forward = tiny_setup()
  mask = np.ones((8, 32), np.int32)
  mask[0] = [1] * 5 + [2] * 4 + [0] * 23  # two packed sequences, padding
  mask[1, 10:] = 0                        # one sequence, padded
  mask[2] = 0                             # padding only: predicts nothing
  mask[3] = [1] * 10 + [2] * 10 + [3] * 12
  rng = np.random.default_rng(3)
  ids = np.where(mask > 0, rng.integers(5, c.model.vocab_size, mask.shape), 0)
  batch = lm_batch(ids, mask)
  params = state["params"]
  logits = forward(params, batch["input_ids"],
                   batch["attention_mask"])["lm_logits"]
  loss, correct, count = np_next_token_sums(logits, ids, mask)
  # The pairs inside each sequence, none across a boundary or into padding.
  assert count == (4 + 3) + 9 + 0 + (9 + 9 + 11) + 4 * 31
  sums = evaluate(params, batch)
  np.testing.assert_allclose(sums["lm_loss_sum"], loss, rtol=1e-5)
  assert float(sums["lm_count"]) == count
  assert float(sums["lm_correct"]) == correct
  metrics = run.objective.metrics(sums)
  np.testing.assert_allclose(metrics["lm_loss"], loss / count, rtol=1e-5)
  np.testing.assert_allclose(metrics["lm_perplexity"],
                             math.exp(loss / count), rtol=1e-5)
  assert float(metrics["loss"]) == float(metrics["lm_loss"])
  assert float(run.objective.denominators(batch)["lm"]) == count
  # Logits with all their mass on the next token: zero loss, all right.
  perfect = np.full((8, 32, 50), -30.0, np.float32)
  for b in range(8):
    for t in range(31):
      perfect[b, t, ids[b, t + 1] % 50] = 30.0
  labels, weights = objectives.lm_targets(jnp.asarray(ids % 50),
                                          jnp.asarray(mask))
  exact = objectives.lm_sums(jnp.asarray(perfect), labels, weights)
  assert float(exact["lm_correct"]) == float(exact["lm_count"]) == count
  assert float(exact["lm_loss_sum"]) < 1e-20


def test_accumulation_equals_one_big_batch():
  """Two micro-batches with very different numbers of targets give the
  one-batch gradients: each is normalised by the whole batch's count."""
  _, _, state, steps, _, _ = tiny_setup()
  batch = cyclic_batch(seed=1)
  mask = np.array(batch["attention_mask"])
  mask[:4, 6:] = 0  # the first micro-batch has few targets
  batch = {**batch, "attention_mask": jnp.asarray(mask)}
  one, m1 = steps[1](state, batch)
  two, m2 = steps[2](state, batch)
  for key in ("lm_loss", "lm_accuracy", "grad_norm"):
    np.testing.assert_allclose(m2[key], m1[key], rtol=2e-5)
  for a, b in zip(jax.tree.leaves(two["params"]),
                  jax.tree.leaves(one["params"])):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7)
  assert float(m1["skipped"]) == 0.0


def test_tiny_gpt_learns_a_repeated_batch():
  """25 AdamW steps on one batch whose next tokens follow from the current
  ones: from chance (ln 1000 ≈ 6.9 nats) to every next token right."""
  _, run, state, steps, evaluate, _ = tiny_setup()
  batch = cyclic_batch()
  before = run.objective.metrics(evaluate(state["params"], batch))
  assert float(before["lm_loss"]) > 6.0
  for _ in range(25):
    state, _ = steps[1](state, batch)
  after = run.objective.metrics(evaluate(state["params"], batch))
  assert float(after["lm_accuracy"]) >= 0.95
  assert float(after["lm_loss"]) < 0.25 * float(before["lm_loss"])


# --------------------------------------------------- setup, FLOPs, config


def test_causal_lm_setup():
  c = gpt_config()
  run = run_spec.run_spec(c)
  assert run.kind == "causal_lm"
  assert not run.masked and not run.unigram_baseline
  b, t = c.batch_size, c.data.max_seq_length
  assert run.batch_schema["input_ids"] == ((b, t), jnp.int32)
  assert run.batch_schema["masked_ids"] == ((b, 0), jnp.int32)
  assert run.flops_per_step == flops.training_flops_per_step(
      run.model_config, b, t, heads=("lm",))
  recorded = json.loads(c.to_json_best_effort())  # as in WORKDIR/config.json
  assert run_spec.run_spec(recorded).heads == ("lm",)
  bad = gpt_config()
  bad.data.objective = "sop"
  with pytest.raises(ValueError, match="data.objective=none"):
    run_spec.run_spec(bad)
  bad = gpt_config()
  bad.model.causal = False
  with pytest.raises(ValueError, match="model.causal=True"):
    run_spec.run_spec(bad)


def test_flops_of_the_causal_lm_by_hand():
  # tiny GPT: V=1000, E=H=64, 2 layers, F=128; T=16, every position decoded.
  cfg = ModelConfig.from_dict(gpt_config().model)
  parts = flops.forward_flops_breakdown(cfg, 16, heads=("lm",))
  assert parts == {
      "embedding_projection": 0,
      "attention_projections": 2 * 16 * 4 * 2 * 64 * 64,
      "attention_scores": 2 * 16 * 4 * 16 * 64 // 2,  # causal: half
      "ffn": 2 * 16 * 2 * 2 * 64 * 128,
      "pooler": 2 * 64 * 64,
      "sop": 0, "mlm_transform": 0, "mlm_decoder": 0,
      "lm_transform": 0,
      "lm_decoder": 16 * 2 * 64 * 1000,
  }
  factorised = dataclasses.replace(cfg, embedding_projection=True,
                                   embedding_size=32)
  assert flops.forward_flops_breakdown(
      factorised, 16, heads=("lm",))["lm_transform"] == 16 * 2 * 64 * 32
  encoder = dataclasses.replace(cfg, causal=False)
  assert flops.forward_flops_breakdown(encoder, 16, heads=())[
      "attention_scores"] == 2 * parts["attention_scores"]


def test_gpt_small_is_gpt1():
  c = gpt_config(None)
  m = c.model
  assert (m.num_hidden_layers, m.hidden_size, m.embedding_size,
          m.num_attention_heads, m.intermediate_size, m.vocab_size,
          m.max_position_embeddings, m.type_vocab_size) == (
              12, 768, 768, 12, 3072, 40478, 512, 1)
  assert m.causal and m.share == "none" and not m.embedding_projection
  assert (m.hidden_act, m.hidden_dropout_prob,
          m.attention_probs_dropout_prob, m.layer_norm_eps) == (
              "gelu", 0.1, 0.1, 1e-5)
  o = c.optimizer
  assert (o.name, o.learning_rate, o.warmup_steps, o.schedule,
          o.end_learning_rate, o.weight_decay, o.bias_correction) == (
              "adamw", 2.5e-4, 2000, "cosine", 0.0, 0.01, True)
  assert (c.batch_size, c.data.max_seq_length, c.data.objective,
          c.data.exact_length, c.pretraining) == (
              64, 512, "none", True, "causal_lm")
  assert c.num_train_steps == round(100 * 1_040_000_000 / (64 * 512))
  assert gpt_config("epochs=1,corpus_tokens=32768000").num_train_steps == 1000
  # 116.5M for GPT-1's weights, plus the pooler, the embedding LayerNorm and
  # the one token-type vector.
  cfg = ModelConfig.from_dict(m)
  shapes = jax.eval_shape(albert_lib.Albert(cfg, heads=("lm",)).init,
                          jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
  layer = 4 * (768 * 768 + 768) + 2 * 768 * 3072 + 3072 + 768 + 4 * 768
  gpt1 = 40478 * 768 + 512 * 768 + 12 * layer
  assert gpt1 == 116_534_784
  assert count == gpt1 + (768 * 768 + 768) + 2 * 768 + 768


@pytest.mark.parametrize("peak, total, warmup, end", [
    (2.5e-4, 100, 20, 0.0), (1.0, 50, 0, 0.1), (3e-3, 37, 5, 1e-4)])
def test_cosine_schedule_matches_optax(peak, total, warmup, end):
  ours = optim.cosine_schedule(peak, total, warmup, end)
  theirs = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, end)
  steps = jnp.arange(total + 10)
  got, want = jit(lambda s: (jax.vmap(ours)(s), jax.vmap(theirs)(s)))(steps)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * peak)
  assert got[0] == 0.0 or warmup == 0
  np.testing.assert_allclose(got[total:], end, rtol=1e-6)


def test_unknown_schedule_is_refused():
  c = gpt_config()
  c.optimizer.schedule = "cosnie"
  with pytest.raises(ValueError, match="choose one of"):
    optim.make(c.optimizer, c.num_train_steps)


# ---------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
  """configs/gpt_small.py:tiny through the CLI on ~20 documents."""
  corpus = tmp_path_factory.mktemp("corpus") / "moby.txt.gz"
  with gzip.open(MOBY_DICK, "rt", encoding="utf-8") as f, gzip.open(
      corpus, "wt", encoding="utf-8") as g:
    docs = 0
    for line in f:
      g.write(line)
      docs += line.strip() == ""
      if docs >= 20:
        break
  workdir = str(tmp_path_factory.mktemp("gpt"))
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
      [sys.executable, "-m", "albert_jax.main",
       "--config=configs/gpt_small.py:tiny", f"--workdir={workdir}",
       f"--config.data.corpus={corpus}", "--config.model.vocab_size=400",
       "--config.num_train_steps=4", "--config.log_every_steps=2",
       "--config.eval_every_steps=4", "--config.checkpoint_every_steps=4"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


@pytest.mark.long
def test_cli_trains_the_tiny_gpt(gpt_run):
  final = json.load(open(os.path.join(gpt_run, "final_metrics.json")))
  assert final["step"] == 4
  assert 0.0 <= final["eval_lm_accuracy"] <= 1.0
  assert final["eval_lm_perplexity"] == pytest.approx(
      math.exp(final["eval_lm_loss"]), rel=1e-5)
  assert "eval_mlm_accuracy" not in final
  # GPT-1's rows: the stream cut at exactly 64 tokens (the tiny length),
  # so every row but the last of the split is full.
  meta = json.load(open(os.path.join(gpt_run, "data", "dataset.json")))
  assert meta["config"]["exact_length"] is True
  train_split = meta["splits"]["train"]
  assert train_split["instances"] > 10
  assert train_split["tokens"] > (train_split["instances"] - 1) * 64
  rows = [json.loads(line) for line in open(
      os.path.join(gpt_run, "tensorboard", "metrics.jsonl"))]
  train = [r for r in rows if "train/lm_loss" in r]
  assert [r["step"] for r in train] == [2, 4]
  # Linear warmup over 3 steps, then the cosine from the peak.
  assert all(0 < r["train/learning_rate"] <= 1e-3 * (1 + 1e-6)
             for r in train)


@pytest.mark.long
def test_load_pretrained_rebuilds_the_causal_model(gpt_run):
  pre = load_pretrained(gpt_run)
  assert pre.model_config.causal and pre.heads == ("lm",)
  assert pre.step == 4
  ids = np.asarray(pre.tokenizer.encode("Call me Ishmael. Some years ago"))
  ids = np.concatenate([[pre.tokenizer.cls_id], ids])[None]
  out = pre(ids)
  table = np.asarray(pre.params["embeddings"]["word_embeddings"]["embedding"])
  np.testing.assert_allclose(
      out["lm_logits"], np.asarray(out["sequence_output"]) @ table.T,
      rtol=1e-4, atol=1e-4)
  changed = ids.copy()
  changed[0, 4:] = pre.tokenizer.sep_id
  np.testing.assert_array_equal(pre(changed)["lm_logits"][0, :4],
                                out["lm_logits"][0, :4])
  with pytest.raises(ValueError, match="causal"):
    pre.fill_mask("Call me [MASK].")
  with pytest.raises(ValueError, match="causal"):
    pre.to_hf(os.path.join(gpt_run, "hf"))
