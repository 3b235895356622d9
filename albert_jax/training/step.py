"""The jitted train and eval steps.

The train step takes any `objectives.Objective` and is jitted with explicit
in/out shardings, donating the old state (`state.py` creates it).

Gradient accumulation runs inside the step as a `lax.scan` over
micro-batches. Each micro-batch's loss is normalised by the whole batch's
denominators (masked positions, sentence labels), so the summed gradients are
exactly those of the full batch.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from albert_jax import sharding as sharding_lib
from albert_jax.training import objectives

State = dict[str, Any]


def _microbatches(batch: dict, count: int) -> dict:
  def split(x):
    if x.shape[0] % count:
      raise ValueError(f"Batch of {x.shape[0]} rows cannot be split into "
                       f"{count} accumulation steps; make "
                       "config.batch_size divisible by "
                       "config.accumulation_steps.")
    return x.reshape((count, x.shape[0] // count) + x.shape[1:])
  return jax.tree.map(split, batch)


def nonfinite_leaves(grads: Any) -> jax.Array:
  """[num_leaves] bool: which gradient leaves hold a NaN or Inf (tree order)."""
  leaves = jax.tree.leaves(grads)
  if not leaves:  # e.g. plain SGD's empty optimizer state
    return jnp.zeros((0,), bool)
  return jnp.stack([~jnp.all(jnp.isfinite(g)) for g in leaves])


def _updates_applied(opt_state, default: jax.Array) -> jax.Array:
  """The learning-rate schedule's own count: steps whose update was applied.

  Skipped (non-finite) steps keep the old optimizer state, so this lags the
  step counter by the number of skips; the schedule follows it.
  """
  is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
  counts = [s.count for s in jax.tree.leaves(opt_state, is_leaf=is_sched)
            if is_sched(s)]
  return counts[0] if counts else default


# Name-stack scopes of the train step's parts after the backward pass.
OPTIMIZER_SCOPE = "optimizer"
GUARD_SCOPE = "nonfinite_guard"
METRICS_SCOPE = "step_metrics"


def make_train_step(objective, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, accumulation_steps: int = 1
                    ) -> Callable[[State, dict], tuple[State, dict]]:
  """(state, batch) → (state, metrics).

  Args:
    objective: an `objectives.Objective`. Batch arrays are [B, ...].
    tx, schedule: from `optimizer.make`.
    accumulation_steps: micro-batches per step (B must divide by it).

  A step whose loss or gradients are not finite, or whose update would
  make a parameter or an optimizer slot non-finite (finite gradients can
  still overflow), changes neither parameters nor optimizer state (so the
  learning-rate schedule does not advance either); the step counter still
  does, so the data moves on. metrics["skipped"] is 1 for it;
  metrics["nonfinite_grads"] and metrics["nonfinite_update"] flag the
  offending gradient and updated-parameter leaves (in the order of
  `tree.flatten(params)`), the latter's last entry the optimizer state.
  """
  if accumulation_steps < 1:
    raise ValueError(f"config.accumulation_steps must be >= 1, got "
                     f"{accumulation_steps}.")

  def step(state: State, batch: dict) -> tuple[State, dict]:
    params = state["params"]
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]),
                             state["step"])
    # Whole-batch denominators, so that each micro-batch's gradient is its
    # share of the full batch's and the accumulated sum is the full gradient.
    dens = objective.denominators(batch)

    def loss_fn(p, micro, micro_rng):
      sums = objective.sums(p, micro, micro_rng, deterministic=False)
      return objectives.loss(sums, dens), sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accumulation_steps == 1:
      (loss, sums), grads = grad_fn(params, batch, rng)
    else:
      micro = _microbatches(batch, accumulation_steps)

      def body(carry, inputs):
        index, mb = inputs
        (l, s), g = grad_fn(params, mb, jax.random.fold_in(rng, index))
        acc_g, acc_s, acc_l = carry
        return (jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc_g, g),
                jax.tree.map(jnp.add, acc_s, s), acc_l + l), None

      # Sum in float32 even for low-precision parameters, so that many
      # micro-batches do not round away each other's contributions.
      zeros_g = jax.tree.map(
          lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype,
                                                         jnp.float32)),
          params)
      zeros_s = jax.tree.map(
          lambda x: jnp.zeros(x.shape, x.dtype),
          jax.eval_shape(lambda: objective.sums(
              params, jax.tree.map(lambda x: x[0], micro), rng, False)))
      (grads, sums, loss), _ = jax.lax.scan(
          body, (zeros_g, zeros_s, jnp.zeros([], jnp.float32)),
          (jnp.arange(accumulation_steps), micro))
      # Back to the parameters' dtype, as a single step's gradients are.
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)

    # The named scopes give the step breakdown (training/step_breakdown.py)
    # the optimizer, the guard and the metrics as rows of their own.
    with jax.named_scope(GUARD_SCOPE):
      # The barrier keeps XLA from copying the whole finiteness check into
      # each parameter's and optimizer slot's update (it halves the HLO).
      bad_leaves = jax.lax.optimization_barrier(nonfinite_leaves(grads))
      ok = jnp.isfinite(loss) & ~jnp.any(bad_leaves)
    with jax.named_scope(OPTIMIZER_SCOPE):
      updates, opt_state = tx.update(grads, state["opt_state"], params)
      new_params = optax.apply_updates(params, updates)
    with jax.named_scope(GUARD_SCOPE):
      bad_update = jax.lax.optimization_barrier(jnp.concatenate([
          nonfinite_leaves(new_params),
          jnp.any(nonfinite_leaves(opt_state), keepdims=True)]))
      ok = ok & ~jnp.any(bad_update)
      # A non-finite step keeps the old parameters and optimizer state.
      keep = lambda new, old: jax.tree.map(
          lambda n, o: jnp.where(ok, n, o), new, old)
      new_params = keep(new_params, params)
      opt_state = keep(opt_state, state["opt_state"])
    with jax.named_scope(METRICS_SCOPE):
      metrics = objective.metrics(sums)
      metrics["grad_norm"] = optax.tree.norm(grads)
      metrics["param_norm"] = optax.tree.norm(new_params)
      metrics["learning_rate"] = schedule(
          _updates_applied(state["opt_state"], state["step"]))
      metrics["skipped"] = 1.0 - ok.astype(jnp.float32)
    metrics["nonfinite_grads"] = bad_leaves
    metrics["nonfinite_update"] = bad_update
    new_state = {**state, "step": state["step"] + 1, "params": new_params,
                 "opt_state": opt_state}
    return new_state, metrics

  return step


def make_eval_step(objective) -> Callable[[Any, dict], dict]:
  """(params, batch) → sums (add them up over batches, then
  `objective.metrics`). `objective` as in `make_train_step`."""

  def step(params, batch):
    return objective.sums(params, batch, None, deterministic=True)
  return step


def jit_train_step(step_fn, state_shardings_: State, mesh, rules,
                   compiler_options: dict[str, Any] | None = None):
  """jit with explicit shardings, run in the mesh and rules
  (`sharding.jit_in_mesh`: also `.jitted` and `.lower`); the old state's
  buffers are donated.

  `compiler_options` go to `jax.jit`, as in `state.create_state`.
  """
  data = sharding_lib.data_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return sharding_lib.jit_in_mesh(
      step_fn, mesh, rules, in_shardings=(state_shardings_, data),
      out_shardings=(state_shardings_, replicated), donate_argnums=(0,),
      compiler_options=compiler_options)
