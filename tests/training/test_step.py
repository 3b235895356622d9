"""The pre-training objective and the jitted train step.

The objective is checked against NumPy cross-entropies; the step against a
hand-rolled `value_and_grad` + `tx.update`, against itself with gradient
accumulation, and through the sharded, donating `jit_train_step` path.
"""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax import config_lib
from albert_jax import sharding
from albert_jax import tree
from albert_jax.model import encoder
from albert_jax.model.albert import Albert
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives
from albert_jax.training import optimizer as optim
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS

TINY = dict(vocab_size=24, embedding_size=8, hidden_size=12,
            num_attention_heads=3, intermediate_size=20,
            max_position_embeddings=12, num_hidden_layers=2)
BATCH, LENGTH, PREDS = 8, 8, 3
# lr 0 at step 0, half the peak at 1, then the decay line from step 0.
PEAK, WARMUP, TOTAL = 0.02, 2, 100
LEARNING_RATES = [0.0, PEAK / 2, PEAK * (1 - 2 / TOTAL), PEAK * (1 - 3 / TOTAL)]
# XLA:CPU's MLIR fusion emitters and LLVM's optimisations dominate compile
# time and buy nothing at these sizes: without them a train step compiles
# about 4x faster. Numerics agree to float rounding.
jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE_OPTIONS)


# ---------------------------------------------------------------------------
# Objectives.


def official_loss(sums):
  """The official loss from whole-batch sums, divided as the train step
  divides them: Σ_term loss_sum / denominator (`objectives.loss`)."""
  dens = {"mlm": sums["mlm_weight"] + objectives.MLM_EPS}
  if "sop_loss_sum" in sums:
    dens["sop"] = jnp.maximum(sums["sop_count"], 1.0)
  return objectives.loss(sums, dens)


def pretraining_sums(out, batch):
  """The masked-LM (+ sentence) sums of a model's outputs, by hand."""
  sums = objectives.mlm_sums(out["mlm_logits"], batch["masked_ids"],
                             batch["masked_weights"])
  if "sop_logits" in out:
    sums.update(objectives.sentence_sums(out["sop_logits"],
                                         batch["sentence_labels"]))
  mask = batch["attention_mask"]
  sums["real_tokens"] = jnp.sum(mask != 0).astype(jnp.float32)
  sums["tokens"] = jnp.asarray(mask.size, jnp.float32)
  return sums


def np_cross_entropy(logits, labels):
  logits = np.asarray(logits, np.float64)
  z = logits.max(-1, keepdims=True)
  log_z = np.log(np.sum(np.exp(logits - z), -1)) + z[..., 0]
  return log_z - np.take_along_axis(logits, labels[..., None], -1)[..., 0]


def test_cross_entropy_hand_computed():
  # softmax([0, ln 3]) = [1/4, 3/4].
  logits = jnp.asarray([[0.0, np.log(3.0)], [0.0, np.log(3.0)]])
  ce = objectives.cross_entropy(logits, jnp.asarray([0, 1]))
  np.testing.assert_allclose(ce, [np.log(4.0), np.log(4.0 / 3.0)], rtol=1e-6)


def test_mlm_sums_and_loss():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
  labels = np.asarray([[1, 4, 0], [2, 2, 3]])
  weights = np.asarray([[1, 1, 0], [1, 0, 0]], np.float32)
  # Make two of the three weighted predictions right, the padded one too.
  logits[0, 0, 1] = logits[1, 0, 2] = logits[0, 2, 0] = 10.0
  sums = objectives.mlm_sums(jnp.asarray(logits), jnp.asarray(labels),
                             jnp.asarray(weights))
  ce = np_cross_entropy(logits, labels)
  expected_sum = ce[0, 0] + ce[0, 1] + ce[1, 0]
  np.testing.assert_allclose(sums["mlm_loss_sum"], expected_sum, rtol=1e-6)
  assert float(sums["mlm_weight"]) == 3.0
  correct = (logits.argmax(-1) == labels)
  assert float(sums["mlm_correct"]) == float(np.sum(correct * weights))
  assert float(sums["mlm_correct"]) == 2.0 + float(correct[0, 1])
  metrics = objectives.masked_lm_metrics(sums)
  np.testing.assert_allclose(metrics["mlm_loss"], expected_sum / (3 + 1e-5),
                             rtol=1e-7)
  # The official +1e-5 is visible in float32 (a 3e-6 relative shift).
  assert abs(float(metrics["mlm_loss"]) - expected_sum / 3) > 1e-6 * (
      expected_sum / 3)
  np.testing.assert_allclose(metrics["mlm_accuracy"],
                             float(sums["mlm_correct"]) / 3, rtol=1e-7)
  # No sentence head: the loss is the MLM loss alone.
  assert float(official_loss(sums)) == float(metrics["mlm_loss"])
  # All weights zero: loss 0, not NaN.
  zero = objectives.mlm_sums(jnp.asarray(logits), jnp.asarray(labels),
                             jnp.zeros_like(jnp.asarray(weights)))
  assert float(official_loss(zero)) == 0.0


def test_sentence_sums_ignore_minus_one():
  logits = np.asarray([[2.0, -1.0], [0.5, 1.5], [3.0, 0.0], [0.0, 0.0]],
                      np.float32)
  labels = np.asarray([0, 0, -1, 1])
  sums = objectives.sentence_sums(jnp.asarray(logits), jnp.asarray(labels))
  ce = np_cross_entropy(logits, np.maximum(labels, 0))
  np.testing.assert_allclose(sums["sop_loss_sum"], ce[0] + ce[1] + ce[3],
                             rtol=1e-6)
  assert float(sums["sop_count"]) == 3.0
  # argmax of a tie is class 0, so row 3 (label 1) is wrong; row 0 right.
  assert float(sums["sop_correct"]) == 1.0
  mlm = {"mlm_loss_sum": jnp.float32(6.0), "mlm_correct": jnp.float32(1.0),
         "mlm_weight": jnp.float32(4.0)}
  total = official_loss({**mlm, **sums})
  np.testing.assert_allclose(
      total, 6.0 / (4.0 + 1e-5) + (ce[0] + ce[1] + ce[3]) / 3, rtol=1e-6)
  metrics = objectives.masked_lm_metrics({**mlm, **sums})
  np.testing.assert_allclose(metrics["sop_loss"], (ce[0] + ce[1] + ce[3]) / 3,
                             rtol=1e-6)
  np.testing.assert_allclose(metrics["sop_accuracy"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["loss"], total, rtol=1e-7)


def test_sums_add_across_splits():
  """Sum form: two halves' sums give the whole batch's loss."""
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(4, 3, 7)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 7, size=(4, 3)))
  weights = jnp.asarray([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]],
                        jnp.float32)
  whole = objectives.mlm_sums(logits, labels, weights)
  halves = [objectives.mlm_sums(logits[s], labels[s], weights[s])
            for s in (slice(0, 2), slice(2, 4))]
  added = jax.tree.map(jnp.add, *halves)
  np.testing.assert_allclose(official_loss(added),
                             official_loss(whole), rtol=1e-6)
  # The mean of the halves' losses is not the same thing.
  mean = np.mean([official_loss(h) for h in halves])
  assert abs(mean - float(official_loss(whole))) > 1e-3


# ---------------------------------------------------------------------------
# The train step.


def make_batch(seed=0, batch=BATCH):
  """A padded batch with real masked positions and sentence labels; some
  prediction slots are padding (weight 0) and one sentence label is -1."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(5, LENGTH + 1, size=batch)
  lengths[0] = LENGTH
  valid = np.arange(LENGTH)[None] < lengths[:, None]
  ids = np.where(valid, rng.integers(5, TINY["vocab_size"],
                                     size=(batch, LENGTH)), 0)
  types = (np.arange(LENGTH)[None] >= (lengths // 2)[:, None]) & valid
  positions = np.stack([np.sort(rng.choice(np.arange(1, n), PREDS, False))
                        for n in lengths])
  weights = np.ones((batch, PREDS), np.float32)
  weights[:, -1] = rng.integers(0, 2, size=batch)
  labels = rng.integers(0, 2, size=batch)
  labels[-1] = -1
  return {
      "input_ids": jnp.asarray(ids, jnp.int32),
      "token_type_ids": jnp.asarray(types, jnp.int32),
      "attention_mask": jnp.asarray(valid, jnp.int32),
      "masked_positions": jnp.asarray(positions, jnp.int32),
      "masked_ids": jnp.asarray(rng.integers(5, TINY["vocab_size"],
                                             size=(batch, PREDS)), jnp.int32),
      "masked_weights": jnp.asarray(weights),
      "sentence_labels": jnp.asarray(labels, jnp.int32),
  }


def make_config(**model):
  config = config_lib.base_config(
      config_lib.tiny_model(**{**TINY, **model}), learning_rate=PEAK,
      num_train_steps=TOTAL, warmup_steps=WARMUP, batch_size=BATCH,
      max_seq_length=LENGTH, max_predictions=PREDS)
  return config


def init_fn(**model):
  """rng → fresh boxed state: the run's `RunSpec.init_params` under
  `state.state_init_fn`."""
  tx = parts(**model)[1]
  return state_lib.state_init_fn(run_spec.run_spec(make_config(**model))
                                 .init_params, tx)


@functools.lru_cache(maxsize=None)
def initial_state():
  """The state from `init_fn` at PRNGKey(0). Dropout and compute dtype do
  not change the parameters, so every model variant starts from it."""
  init = init_fn()

  def unboxed(rng):
    state = init(rng)
    return {**state, "params": nn.unbox(state["params"])}

  return jit(unboxed)(jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=None)
def parts(**model):
  """(model, tx, schedule) for a model variant."""
  config = make_config(**model)
  tx, schedule = optim.make(config.optimizer, config.num_train_steps)
  return Albert(ModelConfig.from_dict(config.model)), tx, schedule


def setup(**model):
  """(model, tx, schedule, initial state); cached, so tests share
  compilations."""
  return (*parts(**model), initial_state())


@functools.lru_cache(maxsize=None)
def compiled_step(accumulation_steps, **model):
  module, tx, schedule = parts(**model)
  return jit(step_lib.make_train_step(objectives.MaskedLMObjective(module),
                                      tx, schedule, accumulation_steps))


def run_steps(step_fn, state, batches):
  metrics = []
  for batch in batches:
    state, m = step_fn(state, batch)
    assert not np.any(m.pop("nonfinite_grads"))
    assert not np.any(m.pop("nonfinite_update"))
    assert float(m.pop("skipped")) == 0.0
    metrics.append(jax.tree.map(float, m))
  return state, metrics


def assert_trees_close(a, b, rtol=1e-6):
  """|a - b| <= rtol·(max|leaf| + 1e-3·max|tree|), leaf by leaf.

  float32 sums taken in another order differ by ulps of their largest
  terms, not of each (possibly cancelled) element, hence the leaf scale. The
  floor is for leaves whose gradient is zero in exact arithmetic (the
  attention key bias: softmax ignores a shift shared by all keys), which
  hold nothing but rounding noise.
  """
  assert jax.tree.structure(a) == jax.tree.structure(b)
  leaves = [np.asarray(x) for x in jax.tree.leaves(b)]
  tree_scale = max(float(np.max(np.abs(y))) for y in leaves if y.size)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0],
                          leaves):
    scale = float(np.max(np.abs(y))) if y.size else 0.0
    np.testing.assert_allclose(np.asarray(x), y, rtol=0,
                               atol=rtol * (scale + 1e-3 * tree_scale),
                               err_msg=jax.tree_util.keystr(path))


BATCHES = [make_batch(seed) for seed in range(4)]


@functools.lru_cache(maxsize=None)
def reference_run():
  """Four hand-rolled steps on `BATCHES`: value_and_grad of the objective
  on `model.apply`, then `tx.update`.

  Returns per step a dict: loss, grads, out (the model's outputs), and the
  params and opt_state after the step.
  """
  module, tx, _, state = setup()

  @jit
  def hand(params, opt_state, batch):
    def loss_fn(p):
      out = module.apply({"params": p}, batch["input_ids"],
                         batch["token_type_ids"], batch["attention_mask"],
                         masked_positions=batch["masked_positions"],
                         deterministic=True)
      return official_loss(
          pretraining_sums(out, batch)), out
    (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return loss, grads, out, optax.apply_updates(params, updates), opt_state

  records = []
  params, opt_state = state["params"], state["opt_state"]
  for batch in BATCHES:
    loss, grads, out, params, opt_state = hand(params, opt_state, batch)
    records.append(dict(loss=loss, grads=grads, out=out, params=params,
                        opt_state=opt_state))
  return records


def test_step_equals_hand_rolled_step():
  """Four steps (lr 0, then warmup, then decay) against `reference_run`.

  The two programs compute the same thing, but XLA may fuse their
  reductions differently, so they agree to float32 rounding, not bits.
  """
  _, _, _, state = setup()
  last, metrics = run_steps(compiled_step(1), state, BATCHES)
  ref = reference_run()[-1]
  assert int(last["step"]) == len(BATCHES)
  assert_trees_close(last["params"], ref["params"])
  assert_trees_close(last["opt_state"], ref["opt_state"])
  for m, r in zip(metrics, reference_run()):
    np.testing.assert_allclose(m["loss"], r["loss"], rtol=1e-6)
  # The steps did move every parameter but the key's bias, which attention
  # cannot depend on (softmax removes it): its gradient is exactly zero.
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                       last["params"], state["params"])
  key_bias = moved["encoder"]["attention"]["key"].pop("bias")
  assert key_bias == 0.0
  assert min(jax.tree.leaves(moved)) > 0.0


def test_metrics_match_independent_computation():
  _, _, _, state = setup()
  _, metrics = run_steps(compiled_step(1), state, BATCHES)
  for batch, m, ref, lr in zip(BATCHES, metrics, reference_run(),
                               LEARNING_RATES):
    w = np.asarray(batch["masked_weights"], np.float64)
    labels = np.asarray(batch["masked_ids"])
    mlm_logits = np.asarray(ref["out"]["mlm_logits"])
    ce = np_cross_entropy(mlm_logits, labels)
    mlm_loss = np.sum(w * ce) / (np.sum(w) + 1e-5)
    mlm_acc = np.sum(w * (mlm_logits.argmax(-1) == labels)) / np.sum(w)
    sop = np.asarray(batch["sentence_labels"])
    valid = sop >= 0
    sop_logits = np.asarray(ref["out"]["sop_logits"])[valid]
    sop_loss = np.mean(np_cross_entropy(sop_logits, sop[valid]))
    sop_acc = np.mean(sop_logits.argmax(-1) == sop[valid])
    grad_norm = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)))
                            for g in jax.tree.leaves(ref["grads"])))
    param_norm = np.sqrt(sum(np.sum(np.square(np.asarray(p, np.float64)))
                             for p in jax.tree.leaves(ref["params"])))
    expected = dict(loss=mlm_loss + sop_loss, mlm_loss=mlm_loss,
                    mlm_accuracy=mlm_acc, sop_loss=sop_loss,
                    sop_accuracy=sop_acc, grad_norm=grad_norm,
                    param_norm=param_norm, learning_rate=lr,
                    padding_fraction=np.mean(np.asarray(
                        batch["attention_mask"]) == 0))
    assert set(m) == set(expected)
    for key, value in expected.items():
      np.testing.assert_allclose(m[key], value, rtol=2e-6, atol=1e-7,
                                 err_msg=key)


def test_grad_norm_is_before_clipping():
  """A batch whose gradient norm exceeds the clip still reports it whole."""
  _, _, _, state = setup()
  params = jax.tree.map(lambda p: p * 20.0, state["params"])
  _, metrics = compiled_step(1)({**state, "params": params}, BATCHES[0])
  assert float(metrics["grad_norm"]) > 1.5


def test_accumulation_matches_one_big_batch():
  _, _, _, state = setup()
  one, m1 = run_steps(compiled_step(1), state, BATCHES)
  four, m4 = run_steps(compiled_step(4), state, BATCHES)
  for a, b in zip(m1, m4):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_allclose(b[key], a[key], rtol=1e-6, atol=1e-7,
                                 err_msg=key)
  # Adam's m/(√v+ε) passes the gradients' relative rounding on to steps of
  # size ~lr, comparable to some parameters: a few ulps more there.
  assert_trees_close(four["params"], one["params"], rtol=5e-6)
  assert_trees_close(four["opt_state"], one["opt_state"])
  assert int(four["step"]) == int(one["step"]) == len(BATCHES)


def test_indivisible_batch_is_refused():
  _, _, _, state = setup()
  module, tx, schedule = parts()
  objective = objectives.MaskedLMObjective(module)
  step = step_lib.make_train_step(objective, tx, schedule,
                                  accumulation_steps=3)
  with pytest.raises(ValueError, match="divisible by config.accumulation"):
    jax.eval_shape(step, state, BATCHES[0])
  with pytest.raises(ValueError, match="accumulation_steps must be >= 1"):
    step_lib.make_train_step(objective, tx, schedule, accumulation_steps=0)


def test_loss_decreases_when_memorising_a_batch():
  """20 steps on one batch roughly halve the loss, MLM included.

  Weights start ×10 (as initializer_range 0.2 would give): LAMB's steps are
  proportional to ‖w‖, so from the 0.02 init the MLM logits barely move in
  20 steps at this learning rate and only the sentence loss would fall.
  """
  state = initial_state()
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x if "layer_norm" in jax.tree_util.keystr(path)
      else 10.0 * x, state["params"])
  state = {**state, "params": params}
  step = compiled_step(1)
  history = []
  for _ in range(20):
    state, metrics = step(state, BATCHES[0])
    metrics.pop("nonfinite_grads")
    metrics.pop("nonfinite_update")
    history.append(jax.tree.map(float, metrics))
  losses = [m["loss"] for m in history]
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.5 * losses[0], losses
  assert history[-1]["mlm_loss"] < 0.6 * history[0]["mlm_loss"], history
  assert history[-1]["sop_loss"] < 0.25 * history[0]["sop_loss"], history
  assert history[-1]["mlm_accuracy"] > history[0]["mlm_accuracy"]


def test_bf16_compute_keeps_float32_state():
  """bfloat16 activations (with accumulation): parameters, moments and the
  loss stay float32, and the loss stays near the float32 model's."""
  state = initial_state()
  step = compiled_step(2, dtype="bfloat16")
  new_state, first = step(state, BATCHES[0])
  new_state, metrics = step(new_state, BATCHES[1])
  for leaf in jax.tree.leaves(new_state["params"]):
    assert leaf.dtype == jnp.float32
  floats = [x for x in jax.tree.leaves(new_state["opt_state"])
            if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(x.dtype == jnp.float32 for x in floats)
  assert metrics["loss"].dtype == jnp.float32
  assert np.isfinite(float(metrics["loss"]))
  _, m32 = compiled_step(1)(state, BATCHES[0])
  assert float(first["loss"]) == pytest.approx(float(m32["loss"]), rel=0.05)
  assert float(first["loss"]) != float(m32["loss"])  # bf16 did take effect


# ---------------------------------------------------------------------------
# The production path: state created into its shardings, donating step.

DROPOUT = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


@functools.lru_cache(maxsize=None)
def sharded_setup():
  """Dropout model, state from `create_state`, `jit_train_step` (donating)
  with accumulation over 4 micro-batches.

  Returns (model, host copy of the initial state, device state, step).
  """
  config = make_config(**DROPOUT)
  module, tx, schedule = parts(**DROPOUT)
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.rules_for(mesh)
  state, shardings = state_lib.create_state(
      init_fn(**DROPOUT), tx, mesh, rules, jax.random.PRNGKey(0),
      compiler_options=FAST_COMPILE_OPTIONS)
  fn = step_lib.make_train_step(objectives.MaskedLMObjective(module), tx,
                                schedule, 4)
  step = step_lib.jit_train_step(fn, shardings, mesh, rules,
                                 compiler_options=FAST_COMPILE_OPTIONS)
  return module, jax.tree.map(np.asarray, state), state, step


def test_create_state_places_the_init_state():
  _, host, state, _ = sharded_setup()
  assert_trees_close(host, initial_state(), rtol=0)
  kernel = state["params"]["encoder"]["attention"]["query"]["kernel"]
  assert isinstance(kernel.sharding, jax.sharding.NamedSharding)
  assert kernel.sharding.mesh.axis_names == ("data", "fsdp", "tensor")
  assert int(state["step"]) == 0


def fresh(host_state, step=None):
  """A device copy of the initial state (optionally at another step), placed
  like `create_state`'s: arrays placed otherwise would compile the step
  once more."""
  if step is not None:
    host_state = {**host_state, "step": np.int32(step)}
  placed = sharded_setup()[2]
  return jax.device_put(host_state,
                        jax.tree.map(lambda x: x.sharding, placed))


def test_donation_step_counter_and_rng():
  _, host, _, step = sharded_setup()
  state = fresh(host)
  new_state, metrics = step(state, BATCHES[0])
  assert all(x.is_deleted() for x in jax.tree.leaves(state))
  assert int(new_state["step"]) == 1
  np.testing.assert_array_equal(new_state["rng"], host["rng"])
  assert np.isfinite(float(metrics["loss"]))
  newer, _ = step(new_state, BATCHES[0])
  assert all(x.is_deleted() for x in jax.tree.leaves(new_state))
  assert int(newer["step"]) == 2


def test_dropout_is_deterministic_and_differs_between_steps():
  _, host, _, step = sharded_setup()
  losses = {}
  for name, at in (("a", 0), ("again", 0), ("next", 1)):
    # Same params and optimizer state; only the step counter differs.
    _, metrics = step(fresh(host, at), BATCHES[0])
    losses[name] = float(metrics["loss"])
  assert losses["a"] == losses["again"]
  assert losses["a"] != losses["next"]


def test_micro_batches_get_their_own_dropout_rngs():
  """Loss of the accumulated step = sums over micro-batches with rng
  fold_in(fold_in(state rng, step), i); with one shared rng (or none)
  it would differ."""
  module, host, _, step = sharded_setup()
  # Four identical micro-batches: only their rngs can tell them apart.
  quarter = jax.tree.map(lambda x: x[:BATCH // 4], BATCHES[0])
  batch = jax.tree.map(lambda x: jnp.concatenate([x] * 4), quarter)
  _, metrics = step(fresh(host, 3), batch)

  @jit
  def sums(params, rng):
    out = module.apply({"params": params}, quarter["input_ids"],
                       quarter["token_type_ids"], quarter["attention_mask"],
                       masked_positions=quarter["masked_positions"],
                       deterministic=False, rngs={"dropout": rng})
    return pretraining_sums(out, quarter)

  base = jax.random.fold_in(jax.random.wrap_key_data(host["rng"]), 3)
  params = fresh(host)["params"]
  per_micro = [sums(params, jax.random.fold_in(base, i)) for i in range(4)]
  expected = objectives.masked_lm_metrics(jax.tree.map(
      lambda *x: sum(x), *per_micro))
  np.testing.assert_allclose(metrics["loss"], expected["loss"], rtol=1e-6)
  shared = objectives.masked_lm_metrics(jax.tree.map(
      lambda x: 4 * x, per_micro[0]))
  assert abs(float(shared["loss"]) - float(metrics["loss"])) > 1e-4


def test_nonfinite_batch_skips_the_update_and_names_the_gradients():
  """A NaN in the batch (here its MLM weights) leaves parameters and optimizer
  state untouched, advances the step, and flags the gradient leaves it
  reached."""
  _, _, _, state = setup()
  step = compiled_step(1)
  bad = {**BATCHES[0], "masked_weights": BATCHES[0]["masked_weights"].at[
      0, 0].set(jnp.nan)}
  after_bad, m = step(jax.tree.map(jnp.copy, state), bad)
  assert float(m["skipped"]) == 1.0
  assert not np.isfinite(float(m["loss"]))
  assert int(after_bad["step"]) == 1
  chex.assert_trees_all_equal(after_bad["params"], state["params"])
  chex.assert_trees_all_equal(after_bad["opt_state"], state["opt_state"])
  paths = list(tree.flatten(state["params"]))
  flagged = {p for p, b in zip(paths, np.asarray(m["nonfinite_grads"])) if b}
  assert "embeddings/word_embeddings/embedding" in flagged
  assert "mlm/output_bias" in flagged
  # The next finite batch trains exactly as if the bad one never came: the
  # optimizer (and its learning-rate schedule) did not see the skipped step.
  after_good, m_good = step(after_bad, BATCHES[1])
  alone, m_alone = step(jax.tree.map(jnp.copy, state), BATCHES[1])
  assert float(m_good["skipped"]) == 0.0
  assert not np.any(np.asarray(m_good["nonfinite_grads"]))
  assert float(m_good["learning_rate"]) == float(m_alone["learning_rate"])
  chex.assert_trees_all_equal(after_good["params"], alone["params"])
  chex.assert_trees_all_equal(after_good["opt_state"], alone["opt_state"])
  assert int(after_good["step"]) == 2


def test_an_update_that_overflows_is_skipped_and_named():
  """Finite loss and gradients, but an update so large that it overflows
  float32: the step is skipped like a non-finite gradient, and
  the parameters whose update overflowed are flagged."""
  module, _, schedule = parts()
  _, _, _, state = setup()
  # Each update is 3e38 · sign(g) · 10: infinite in float32.
  huge = optax.chain(optax.scale_by_sign(), optax.scale(-3e38),
                     optax.scale(10.0))
  step = jit(step_lib.make_train_step(objectives.MaskedLMObjective(module),
                                      huge, schedule, 1))
  state = {**state, "opt_state": huge.init(state["params"])}
  after, m = step(jax.tree.map(jnp.copy, state), BATCHES[0])
  assert float(m["skipped"]) == 1.0 and np.isfinite(float(m["loss"]))
  assert not np.any(np.asarray(m["nonfinite_grads"]))
  paths = list(tree.flatten(state["params"]))
  flags = np.asarray(m["nonfinite_update"])
  assert flags.shape == (len(paths) + 1,)
  assert "mlm/output_bias" in {p for p, b in zip(paths, flags) if b}
  chex.assert_trees_all_equal(after["params"], state["params"])


def test_roberta_positions_ignore_a_random_pad_token():
  """With positions counted from the padding, a masked token that the masker
  replaced by <pad> (a random id can be any id) keeps everyone's position:
  the objective counts positions over the attention mask, as if the
  original token were there."""
  cfg = ModelConfig(**{**config_lib.TINY, "vocab_size": 50,
                       "max_position_embeddings": 20, "pad_token_id": 1,
                       "position_ids_from_padding": True, "type_vocab_size": 1})
  model = Albert(cfg, heads=("mlm",))
  ids = jnp.array([[0, 5, 6, 7, 8, 2, 1, 1],
                   [0, 9, 10, 11, 12, 13, 14, 2]], jnp.int32)
  mask = (ids != 1).astype(jnp.int32)
  noisy = ids.at[0, 3].set(1).at[1, 2].set(1)  # two targets became <pad>
  batch = {"input_ids": noisy, "token_type_ids": jnp.zeros_like(ids),
           "attention_mask": mask,
           "masked_positions": jnp.array([[3, 0], [2, 0]], jnp.int32),
           "masked_ids": jnp.array([[7, 0], [10, 0]], jnp.int32),
           "masked_weights": jnp.array([[1.0, 0.0], [1.0, 0.0]]),
           "sentence_labels": jnp.array([-1, -1], jnp.int32)}
  params = jax.jit(model.init)(jax.random.key(0), ids)["params"]
  got = objectives.MaskedLMObjective(model).sums(params, batch, None, True)
  # Positions counted from the clean ids (pad id 1; no mask given).
  out = model.apply({"params": params}, noisy, batch["token_type_ids"], mask,
                    position_ids=encoder.position_ids(cfg, ids),
                    masked_positions=batch["masked_positions"])
  want = pretraining_sums(out, batch)
  chex.assert_trees_all_close(got, want, rtol=1e-6)
  # Counting from the noisy ids would have shifted the rows' positions.
  shifted = model.apply({"params": params}, noisy, batch["token_type_ids"],
                        mask, position_ids=encoder.position_ids(cfg, noisy),
                        masked_positions=batch["masked_positions"])
  assert not np.allclose(shifted["mlm_logits"], out["mlm_logits"])
