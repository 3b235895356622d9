"""GPT-1's auxiliary language-modelling loss in fine-tuning
(`config.lm_aux_weight`): the combined loss against a NumPy reference, the
train step's gradients, the pre-trained "lm" head, and the errors."""

import functools
import json
import sys

import flax.linen as nn
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax import config_lib
from albert_jax.finetune import registry
from albert_jax.finetune import run as ft
from albert_jax.finetune import starting_point as start_lib
from albert_jax.finetune import task as task_lib
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import checkpoints
from albert_jax.training import objectives
from albert_jax.training import optimizer as optim
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS

TOKENIZER = None  # set per test: a tokenizer of VOCAB pieces (below)
VOCAB, SEQ = 64, 8


@pytest.fixture(autouse=True)
def _tokenizer_of_the_models_size(spm_of_size, monkeypatch):
  """The toy model embeds VOCAB ids: its tokenizer has that many pieces
  (fine-tuning refuses a larger one)."""
  monkeypatch.setattr(sys.modules[__name__], "TOKENIZER", spm_of_size(VOCAB))
LAMBDA = 0.5
FAST = hypothesis.settings(max_examples=20, deadline=None, derandomize=True,
                           database=None)

# Four hand-made rows of 8 tokens: full; padded after 5 tokens; two packed
# sequences (3 + 4 tokens) then padding; and a row that pads an eval batch
# (weight 0). Predicted positions: 7 + 4 + (2 + 3) + 0 = 16.
IDS = np.array([[5, 9, 17, 33, 2, 41, 8, 60],
                [6, 12, 12, 50, 31, 0, 0, 0],
                [7, 22, 3, 19, 44, 10, 58, 0],
                [11, 13, 27, 36, 40, 63, 0, 0]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1, 1, 1],
                 [1, 1, 1, 1, 1, 0, 0, 0],
                 [1, 1, 1, 2, 2, 2, 2, 0],
                 [1, 1, 1, 1, 1, 1, 0, 0]], np.int32)
WEIGHTS = np.array([1.0, 1.0, 1.0, 0.0], np.float32)
LABELS = np.array([1, 0, 1, 1], np.int32)


def toy_batch():
  return {"input_ids": IDS, "token_type_ids": np.zeros_like(IDS),
          "attention_mask": MASK, "labels": LABELS, "weights": WEIGHTS}


def predicted(ids, mask, weights):
  """(row, position, next token) of every next-token prediction, by hand:
  both tokens real and of one packed sequence, in a row of weight > 0."""
  return [(r, t, int(ids[r, t + 1]))
          for r in range(ids.shape[0]) if weights[r] > 0
          for t in range(ids.shape[1] - 1)
          if mask[r, t] != 0 and mask[r, t + 1] == mask[r, t]]


def numpy_lm_loss(lm_logits, ids, mask, weights):
  """Mean next-token cross-entropy in float64 over `predicted` positions."""
  logits = np.asarray(lm_logits, np.float64)
  top = logits.max(-1, keepdims=True)
  log_z = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
  terms = [log_z[r, t] - logits[r, t, y]
           for r, t, y in predicted(ids, mask, weights)]
  return float(np.mean(terms))


class Head(nn.Module):
  config: object

  @nn.compact
  def __call__(self, encoded, batch, deterministic):
    del batch, deterministic
    return {"logits": layers.Dense((2,), ("embed", "classes"),
                                   name="out")(encoded["pooled_output"])}


class ToyTask(task_lib.Task):
  """Two-way classification of hand-made rows."""
  name = "toy"
  metric = "accuracy"
  eval_splits = ("validation",)

  def load(self, split, tokenizer, max_seq_length):
    rng = np.random.default_rng({"train": 0, "validation": 1}[split])
    n = {"train": 8, "validation": 4}[split]
    ids = rng.integers(4, VOCAB, size=(n, SEQ)).astype(np.int32)
    mask = np.ones((n, SEQ), np.int32)
    mask[: n // 2, SEQ - 3:] = 0
    ids[mask == 0] = 0
    return task_lib.Split(split, {
        "input_ids": ids, "token_type_ids": np.zeros_like(ids),
        "attention_mask": mask,
        "labels": rng.integers(0, 2, size=n).astype(np.int32)})

  def head(self, model_config):
    return Head(model_config)

  def loss_sums(self, outputs, batch):
    logits = outputs["logits"].astype(jnp.float32)
    ce = objectives.cross_entropy(logits, batch["labels"])
    return {"loss_sum": jnp.sum(ce * batch["weights"])}

  def predict(self, outputs, batch):
    return {"label": jnp.argmax(outputs["logits"], -1)}

  def evaluate(self, predictions, split):
    return {"accuracy": float(np.mean(
        predictions["label"] == split.features["labels"]))}

  def write_predictions(self, predictions, split, directory):
    return []


def model_section(causal=True):
  """A tiny model; with the E→H projection, so the "lm" head has its own
  H→E transform to load."""
  return config_lib.tiny_model(vocab_size=VOCAB, max_position_embeddings=SEQ,
                               causal=causal, classifier_dropout_prob=0.0)


def close(a, b):
  """Equal up to float32 rounding of the parameters' updates."""
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def task_loss(logits, labels, weights):
  """Mean cross-entropy of the real rows, in jnp (differentiable)."""
  ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
      logits, labels[:, None], -1)[:, 0]
  return jnp.sum(ce * weights) / jnp.sum(weights)


@pytest.fixture(scope="module")
def causal_setup(fast_compile):
  """(models with and without the "lm" head, their initial params)."""
  cfg = ModelConfig.from_dict(model_section())
  with_lm = task_lib.FineTuneModel(cfg, Head(cfg), lm_head=True)
  plain = task_lib.FineTuneModel(cfg, Head(cfg))
  params = nn.meta.unbox(jax.jit(with_lm.init, compiler_options=fast_compile)(
      jax.random.key(0), toy_batch())["params"])
  return with_lm, plain, params


def test_combined_loss_is_task_plus_lambda_numpy_lm_loss(causal_setup,
                                                         fast_compile):
  with_lm, _, params = causal_setup
  objective = task_lib.TaskObjective(with_lm, ToyTask(), LAMBDA)
  batch = toy_batch()
  sums = jax.jit(lambda p, b: objective.sums(p, b, None, True),
                 compiler_options=fast_compile)(params, batch)
  dens = objective.denominators(batch)
  assert set(dens) == {"task", "lm_aux"}
  assert float(dens["lm_aux"]) == 16.0 == len(predicted(IDS, MASK, WEIGHTS))
  assert float(sums["lm_count"]) == 16.0
  # The loss exactly as the train step forms it from sums and denominators.
  combined = sum(float(sums[f"{t}_loss_sum"] / d) for t, d in dens.items())
  outputs = jax.jit(with_lm.apply, compiler_options=fast_compile)(
      {"params": params}, batch)
  assert outputs["lm_logits"].shape == (4, SEQ, VOCAB)
  task = float(task_loss(outputs["logits"], LABELS, WEIGHTS))
  lm = numpy_lm_loss(outputs["lm_logits"], IDS, MASK, WEIGHTS)
  np.testing.assert_allclose(combined, task + LAMBDA * lm, rtol=2e-6)
  metrics = objective.metrics(sums)
  np.testing.assert_allclose(metrics["loss"], task, rtol=2e-6)
  np.testing.assert_allclose(metrics["lm_loss"], lm, rtol=2e-6)


def test_zero_weight_is_exactly_the_task_loss(causal_setup, fast_compile):
  """λ = 0 (the default) is the task objective alone, bit for bit."""
  with_lm, plain, params = causal_setup
  assert start_lib.lm_aux_weight(
      config_lib.classify_config().lm_aux_weight) == 0.0
  task = ToyTask()
  params = {**params, "albert": {k: v for k, v in params["albert"].items()
                                 if k != "lm"}}
  batch = toy_batch()
  old = task_lib.TaskObjective(plain, task)
  new = task_lib.TaskObjective(plain, task, lm_aux_weight=0.0)

  def run(objective):
    return jax.jit(lambda p, b: objective.sums(p, b, None, True),
                   compiler_options=fast_compile)(params, batch)
  old_sums, new_sums = run(old), run(new)
  # The task's sums, plus the batch's token counts (its padding share).
  assert set(new_sums) == set(old_sums) == {
      "task_loss_sum", "task_count", "real_tokens", "tokens"}
  for k in old_sums:
    np.testing.assert_array_equal(new_sums[k], old_sums[k])
  assert set(new.denominators(batch)) == {"task"}
  assert set(new.metrics(new_sums)) == {"loss", "padding_fraction",
                                        "examples"}
  with pytest.raises(ValueError, match="lm_head=True"):
    task_lib.TaskObjective(plain, task, LAMBDA)
  with pytest.raises(ValueError, match=">= 0"):
    task_lib.TaskObjective(with_lm, task, -0.5)


def test_train_step_descends_the_combined_loss(causal_setup, fast_compile):
  """One SGD step (learning rate 1) moves the parameters by minus the
  gradient of task + λ × next-token loss, written independently here. With
  λ = 0 it is the task loss's gradient: the head moves the same (the LM term
  does not reach it), the word embeddings differently."""
  with_lm, plain, params = causal_setup
  batch = toy_batch()
  tx = optax.sgd(1.0)
  positions = np.array(predicted(IDS, MASK, WEIGHTS))

  def reference(p, weight):
    out = with_lm.apply({"params": p}, batch)
    logp = jax.nn.log_softmax(out["lm_logits"], -1)
    lm = -jnp.mean(logp[positions[:, 0], positions[:, 1], positions[:, 2]])
    return task_loss(out["logits"], LABELS, WEIGHTS) + weight * lm

  def moved(objective, p):
    state = {"step": jnp.zeros([], jnp.int32), "params": p,
             "opt_state": tx.init(p),
             "rng": jax.random.key_data(jax.random.key(1))}
    step = step_lib.make_train_step(objective, tx,
                                    optax.constant_schedule(1.0))
    new, metrics = jax.jit(step, compiler_options=fast_compile)(state, batch)
    return jax.tree.map(jnp.subtract, p, new["params"]), metrics

  task = ToyTask()
  step_aux, metrics = moved(task_lib.TaskObjective(with_lm, task, LAMBDA),
                            params)
  grads = jax.jit(jax.grad(reference), static_argnums=1,
                  compiler_options=fast_compile)(params, LAMBDA)
  jax.tree.map(close, step_aux, grads)
  assert {"loss", "lm_loss", "lm_accuracy"} <= set(metrics)

  no_lm = {**params, "albert": {k: v for k, v in params["albert"].items()
                                if k != "lm"}}
  step_task, _ = moved(task_lib.TaskObjective(plain, task), no_lm)
  task_grads = jax.jit(jax.grad(reference), static_argnums=1,
                       compiler_options=fast_compile)(params, 0.0)
  del task_grads["albert"]["lm"]
  jax.tree.map(close, step_task, task_grads)
  jax.tree.map(close, step_task["head"], step_aux["head"])
  word = [np.asarray(s["albert"]["embeddings"]["word_embeddings"]["embedding"])
          for s in (step_aux, step_task)]
  delta = np.abs(word[0] - word[1])
  assert delta.max() > 1e-3, delta.max()


# Jitted: a handful of shapes, each compiled once (quickly: LLVM's
# optimisations only cost compile time at these sizes), however many
# contents; op-by-op dispatch would compile every op of every shape.
quick_jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE_OPTIONS)
aux_sums = quick_jit(task_lib.lm_aux_sums)


@quick_jit
def lm_sums(logits, input_ids, attention_mask):
  """Pre-training's next-token sums of [B, T] ids and mask."""
  return objectives.lm_sums(
      logits, *objectives.lm_targets(input_ids, attention_mask))


@hypothesis.given(choices=st.sampled_from([1, 3]),
                  length=st.sampled_from([2, 6]), seed=st.integers(0, 2**16))
@FAST
def test_lm_aux_sums_match_pretraining_lm_sums(choices, length, seed):
  """On rows of weight 1 the fine-tuning sums are pre-training's
  `objectives.lm_sums`; rows of weight 0 add nothing; each choice of a
  multiple-choice row is a row of its own."""
  rng = np.random.default_rng(seed)
  n, vocab = 3, 7
  shape = (n, choices, length)
  ids = rng.integers(0, vocab, shape).astype(np.int32)
  mask = rng.integers(0, 3, shape).astype(np.int32)  # 0 pad, 1-2 segments
  logits = rng.standard_normal(shape + (vocab,)).astype(np.float32)
  weights = np.array([1.0, 0.0, 1.0], np.float32)
  got = aux_sums(logits, {"input_ids": ids, "attention_mask": mask,
                          "weights": weights})
  kept = weights > 0
  want = lm_sums(logits[kept].reshape(-1, length, vocab),
                 ids[kept].reshape(-1, length), mask[kept].reshape(-1, length))
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
  flat = predicted(ids.reshape(-1, length), mask.reshape(-1, length),
                   np.repeat(weights, choices))
  assert float(got["lm_count"]) == len(flat)


def write_workdir(path, causal, fast_compile, seed=7):
  """A pre-training workdir (config.json and one checkpoint) of the tiny
  model, its parameters drawn from `seed`: causal_lm with the "lm" head, or
  masked LM."""
  config = config_lib.base_config(
      model_section(causal), objective="none", batch_size=4,
      num_train_steps=4, warmup_steps=1, max_seq_length=SEQ,
      max_predictions=2)
  config.data.tokenizer = TOKENIZER
  if causal:
    config.pretraining = "causal_lm"
  spec = run_spec.run_spec(config)
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  init = state_lib.state_init_fn(spec.init_params, tx)

  def unboxed(rng):
    state = init(rng)
    return {**state, "params": nn.meta.unbox(state["params"])}
  state = jax.jit(unboxed, compiler_options=fast_compile)(
      jax.random.key(seed))
  state["step"] = jnp.asarray(4, jnp.int32)
  mngr = checkpoints.manager(str(path), async_save=False)
  checkpoints.save(mngr, state, {"step": 4, "data_position": 4})
  mngr.wait_until_finished()
  (path / "config.json").write_text(config.to_json_best_effort(),
                                    encoding="utf-8")
  return jax.device_get(state["params"])


def finetune_config(init, **overrides):
  c = config_lib.finetune_config(
      "toy", learning_rate=1e-3, batch_size=4, num_train_steps=2,
      warmup_steps=1, max_seq_length=SEQ, dropout=0.0)
  c.init = str(init)
  c.data.tokenizer = TOKENIZER
  c.log_every_steps = 1
  c.eval_every_steps = c.checkpoint_every_steps = 2
  c.keep_checkpoints = 1
  c.async_checkpoints = False
  c.fast_compile = True
  for k, v in overrides.items():
    c[k] = v
  return c


def test_run_starts_from_the_pretrained_lm_head_and_logs_lm_loss(
    tmp_path, monkeypatch, fast_compile):
  pre = write_workdir(tmp_path / "gpt", True, fast_compile)
  assert set(pre["lm"]) == {"transform"}  # more than the tied table
  monkeypatch.setattr(registry, "make_task", lambda name, data: ToyTask())
  placed = {}
  place = start_lib.place_encoder

  def spy(state, shardings, encoder, required=()):
    out = place(state, shardings, encoder, required)
    placed["fresh"] = jax.device_get(state["params"]["albert"])
    placed["params"] = jax.device_get(out["params"]["albert"])
    placed["required"] = required
    return out
  monkeypatch.setattr(start_lib, "place_encoder", spy)
  workdir = tmp_path / "ft"
  result = ft.run(finetune_config(tmp_path / "gpt", lm_aux_weight=LAMBDA),
                  str(workdir))
  assert result["step"] == 2
  assert placed["required"] == ("lm",)
  for part in ("lm", "embeddings", "encoder"):
    jax.tree.map(np.testing.assert_array_equal, placed["params"][part],
                 pre[part])
  # The fresh initialisation differs, so the equality above is the load's.
  assert not np.allclose(placed["fresh"]["lm"]["transform"]["kernel"],
                         pre["lm"]["transform"]["kernel"])
  with open(workdir / "tensorboard" / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  train = [r for r in rows if "train/lm_loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    # Random weights over 64 tokens: about ln 64 per token.
    assert 2.0 < r["train/lm_loss"] < 6.0 and "train/loss" in r


def test_missing_lm_head_is_refused_not_initialised():
  fresh = {"params": {"albert": {
      "embeddings": {"w": np.zeros(2)},
      "lm": {"transform": {"kernel": np.zeros((4, 2))}}}}}
  encoder = {"embeddings": {"w": np.ones(2)}}
  with pytest.raises(ValueError, match=r"no 'lm' parameters.*transform"):
    start_lib.place_encoder(fresh, None, encoder, required=("lm",))


def test_bidirectional_model_is_refused(tmp_path, monkeypatch, fast_compile):
  monkeypatch.setattr(registry, "make_task", lambda name, data: ToyTask())
  write_workdir(tmp_path / "albert", False, fast_compile)
  config = finetune_config(tmp_path / "albert", lm_aux_weight=LAMBDA)
  with pytest.raises(ValueError, match=r"needs a causal \(GPT\) model.*"
                     r"lm_aux_weight=0"):
    ft.run(config, str(tmp_path / "ft"))
  # From random weights too, and whatever the weight's size.
  config = finetune_config("", lm_aux_weight=1e-3)
  for k, v in model_section(causal=False).items():
    config.model[k] = v
  with pytest.raises(ValueError, match=r"causal \(GPT\)"):
    start_lib.encoder_start(start_lib.StartOptions.from_config(config))
  # λ = 0 fine-tunes the bidirectional model as before.
  config.lm_aux_weight = 0.0
  assert not start_lib.encoder_start(
      start_lib.StartOptions.from_config(config))[0].causal


def test_bad_weights_are_refused(tmp_path, monkeypatch):
  """Refused before the checkpoint (here a missing one) is even read."""
  monkeypatch.setattr(registry, "make_task", lambda name, data: ToyTask())
  config = finetune_config(tmp_path / "nowhere", lm_aux_weight=-0.5)
  with pytest.raises(ValueError, match="lm_aux_weight must be a number >= 0"):
    ft.run(config, str(tmp_path / "ft"))
  causal = ModelConfig.from_dict(model_section())
  for weight in (float("nan"), float("inf"), True, "0.5"):
    with pytest.raises(ValueError, match="must be a number >= 0"):
      start_lib.lm_aux_weight(weight, causal)
