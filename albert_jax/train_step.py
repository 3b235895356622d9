"""The train state, created already sharded, and the jitted train/eval steps.

State is a plain dict pytree: {"step", "params", "opt_state", "rng"}. Its
shardings come from the parameters' logical axis names through the config's
rules; `jax.jit(init, out_shardings=...)` materialises it in place, so no
device ever holds a full replica it does not need. The train step is jitted
with explicit in/out shardings and donates the old state.

Gradient accumulation runs inside the step as a `lax.scan` over
micro-batches. Each micro-batch's loss is normalised by the whole batch's
denominators (masked positions, sentence labels), so the summed gradients are
exactly those of the full batch.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from albert_jax import objectives
from albert_jax import sharding as sharding_lib

State = dict[str, Any]
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask",
              "masked_positions", "masked_ids", "masked_weights",
              "sentence_labels")


def init_fn(model: nn.Module, tx: optax.GradientTransformation,
            seq_len: int, num_predictions: int) -> Callable[[jax.Array], State]:
  """rng → fresh state with boxed (logically named) parameters."""
  def init(rng):
    param_rng, state_rng = jax.random.split(rng)
    ids = jnp.zeros((1, seq_len), jnp.int32)
    variables = model.init(param_rng, ids, masked_positions=jnp.zeros(
        (1, num_predictions), jnp.int32))
    params = variables["params"]
    return {
        "step": jnp.zeros([], jnp.int32),
        "params": params,
        "opt_state": tx.init(nn.meta.unbox(params)),
        "rng": jax.random.key_data(state_rng),
    }
  return init


def create_state(model: nn.Module, tx: optax.GradientTransformation, mesh,
                 rules, rng: jax.Array, seq_len: int, num_predictions: int,
                 compiler_options: dict[str, Any] | None = None
                 ) -> tuple[State, State]:
  """Initialises the state directly into its shardings.

  Args:
    compiler_options: passed to `jax.jit` (e.g. a lower XLA optimisation
      level where compile time matters more than speed, as in tests).

  Returns:
    (state, shardings), both with unboxed parameters.
  """
  init = init_fn(model, tx, seq_len, num_predictions)
  abstract = jax.eval_shape(init, rng)
  shardings = state_shardings(abstract, tx, mesh, rules)

  def unboxed_init(r):
    s = init(r)
    return {**s, "params": nn.meta.unbox(s["params"])}

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(unboxed_init, out_shardings=shardings,
                    compiler_options=compiler_options)(rng)
  return state, shardings


def state_shardings(abstract_boxed: State, tx, mesh, rules) -> State:
  """Shardings of the state from the boxed abstract state."""
  params = sharding_lib.logical_shardings(abstract_boxed["params"], mesh,
                                          rules)
  unboxed = {**abstract_boxed, "params": nn.meta.unbox(
      abstract_boxed["params"])}
  return sharding_lib.state_shardings(tx, unboxed, params, mesh)


def _microbatches(batch: dict, count: int) -> dict:
  def split(x):
    if x.shape[0] % count:
      raise ValueError(f"Batch of {x.shape[0]} rows cannot be split into "
                       f"{count} accumulation steps; make "
                       "config.batch_size divisible by "
                       "config.accumulation_steps.")
    return x.reshape((count, x.shape[0] // count) + x.shape[1:])
  return jax.tree.map(split, batch)


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, accumulation_steps: int = 1
                    ) -> Callable[[State, dict], tuple[State, dict]]:
  """(state, batch) → (state, metrics). Batch: `BATCH_KEYS` arrays [B, ...]."""
  if accumulation_steps < 1:
    raise ValueError(f"config.accumulation_steps must be >= 1, got "
                     f"{accumulation_steps}.")

  def forward_sums(params, micro, rng):
    out = model.apply(
        {"params": params}, micro["input_ids"], micro["token_type_ids"],
        micro["attention_mask"], masked_positions=micro["masked_positions"],
        deterministic=False, rngs={"dropout": rng})
    return objectives.pretraining_sums(out, micro)

  def step(state: State, batch: dict) -> tuple[State, dict]:
    params = state["params"]
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]),
                             state["step"])
    # Whole-batch denominators, so that each micro-batch's gradient is its
    # share of the full batch's and the accumulated sum is the full gradient.
    mlm_den = jnp.sum(batch["masked_weights"].astype(jnp.float32)) + (
        objectives.MLM_EPS)
    # An MLM-only model may be fed batches without sentence labels.
    sop_den = jnp.maximum(jnp.sum(
        (batch["sentence_labels"] >= 0).astype(jnp.float32)), 1.0) if (
            "sentence_labels" in batch) else None

    def loss_fn(p, micro, micro_rng):
      sums = forward_sums(p, micro, micro_rng)
      loss = sums["mlm_loss_sum"] / mlm_den
      if "sop_loss_sum" in sums:
        loss = loss + sums["sop_loss_sum"] / sop_den
      return loss, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accumulation_steps == 1:
      (_, sums), grads = grad_fn(params, batch, rng)
    else:
      micro = _microbatches(batch, accumulation_steps)

      def body(carry, inputs):
        index, mb = inputs
        (_, s), g = grad_fn(params, mb, jax.random.fold_in(rng, index))
        acc_g, acc_s = carry
        return (jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc_g, g),
                jax.tree.map(jnp.add, acc_s, s)), None

      # Sum in float32 even for low-precision parameters, so that many
      # micro-batches do not round away each other's contributions.
      zeros_g = jax.tree.map(
          lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype,
                                                         jnp.float32)),
          params)
      zeros_s = jax.tree.map(
          lambda x: jnp.zeros(x.shape, x.dtype),
          jax.eval_shape(lambda: forward_sums(
              params, jax.tree.map(lambda x: x[0], micro), rng)))
      (grads, sums), _ = jax.lax.scan(
          body, (zeros_g, zeros_s),
          (jnp.arange(accumulation_steps), micro))
      # Back to the parameters' dtype, as a single step's gradients are.
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)

    updates, opt_state = tx.update(grads, state["opt_state"], params)
    new_params = optax.apply_updates(params, updates)
    metrics = objectives.metrics_from_sums(sums)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["param_norm"] = optax.tree.norm(new_params)
    metrics["learning_rate"] = schedule(state["step"])
    new_state = {**state, "step": state["step"] + 1, "params": new_params,
                 "opt_state": opt_state}
    return new_state, metrics

  return step


def make_eval_step(model: nn.Module) -> Callable[[Any, dict], dict]:
  """(params, batch) → sums (add them up over batches, then
  `objectives.metrics_from_sums`)."""
  def step(params, batch):
    out = model.apply({"params": params}, batch["input_ids"],
                      batch["token_type_ids"], batch["attention_mask"],
                      masked_positions=batch["masked_positions"],
                      deterministic=True)
    return objectives.pretraining_sums(out, batch)
  return step


def jit_train_step(step_fn, state_shardings_: State, mesh, rules,
                   compiler_options: dict[str, Any] | None = None):
  """jit with explicit shardings; the old state's buffers are donated.

  `compiler_options` go to `jax.jit`, as in `create_state`.
  """
  data = sharding_lib.data_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  jitted = jax.jit(step_fn, in_shardings=(state_shardings_, data),
                   out_shardings=(state_shardings_, replicated),
                   donate_argnums=(0,), compiler_options=compiler_options)

  @functools.wraps(step_fn)
  def run(state, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return jitted(state, batch)
  run.jitted = jitted
  return run

