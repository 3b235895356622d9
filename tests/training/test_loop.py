"""The shared training loop: the non-finite guard and its stop."""

import logging
import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax.training import checkpoints
from albert_jax.training import defaults
from albert_jax.training import goodput
from albert_jax.training import guards
from albert_jax.training import loop
from albert_jax.training import profiling


def test_guard_counts_consecutive_skips_and_names_parameters(caplog):
  guard = guards.NonFiniteGuard(3, ["a/kernel", "b/bias"])
  with caplog.at_level(logging.WARNING, logger="albert_jax.training.loop"):
    guard.update(1, 1.0, np.array([True, False]))
  assert "Step 1" in caplog.text and "a/kernel" in caplog.text
  guard.update(2, 1.0, np.array([False, False]))
  guard.update(3, 0.0, np.array([False, False]))  # a finite step resets
  assert (guard.streak, guard.total) == (0, 2)
  guard.update(4, 1.0, np.array([False, True]))
  guard.update(5, 1.0, np.array([False, True]))
  with pytest.raises(guards.NonFiniteError) as e:
    guard.update(6, 1.0, np.array([True, True]))
  message = str(e.value)
  assert "Stopped at step 6" in message
  assert "last 3 steps" in message
  assert "a/kernel, b/bias" in message
  assert "learning_rate" in message and "max_consecutive_nonfinite" in message
  assert guard.total == 5


def test_guard_names_the_loss_when_no_gradient_is_bad():
  guard = guards.NonFiniteGuard(1, ["w"])
  with pytest.raises(guards.NonFiniteError, match=r"none \(the loss itself\)"):
    guard.update(1, 1.0, np.array([False]))


def test_guard_names_the_parameters_an_update_made_non_finite():
  guard = guards.NonFiniteGuard(1, ["a/kernel", "b/bias"])
  with pytest.raises(guards.NonFiniteError) as e:
    guard.update(4, 1.0, np.array([False, False]),
                 np.array([False, True, True]))
  assert ("Non-finite at step 4: b/bias (its update), the optimizer state."
          in str(e.value))


def test_a_run_that_started_non_finite_saves_nothing(tmp_path):
  """Every step skipped because the parameters were NaN from the start (a
  damaged checkpoint): the run stops without claiming, or saving, a last
  finite step."""
  config = _config()
  state = {"step": jnp.zeros([], jnp.int32),
           "params": {"w": jnp.full(2, jnp.nan)}}
  mngr = checkpoints.manager(str(tmp_path), async_save=False)
  with pytest.raises(guards.NonFiniteError) as e:
    loop.fit(loop.LoopOptions.from_config(config), loop.FitPlan(
        state=state, train_step=_fake_step(1),
        batches=((i, None) for i in range(10)), start_step=0,
        resumed=False, mngr=mngr, workdir=str(tmp_path), evaluate=None,
        flops_per_step=1.0,
        rows_per_step=config.batch_size, tokens_per_sequence=4,
        param_paths=["w"]))
  assert str(e.value).endswith(
      "The parameters or optimizer state were already non-finite before "
      f"these steps (a damaged checkpoint or init); nothing was saved. Resume "
      f"from an earlier checkpoint in {tmp_path}, or start a new run.")
  assert checkpoints.available_steps(str(tmp_path)) == []


def test_guard_refuses_a_nonpositive_limit():
  with pytest.raises(ValueError, match="max_consecutive_nonfinite"):
    guards.NonFiniteGuard(0, [])


def _config(**overrides):
  return ml_collections.ConfigDict(defaults.upgrade({**dict(
      num_train_steps=10, log_every_steps=4, eval_every_steps=100,
      checkpoint_every_steps=100, batch_size=2, seed=0,
      max_consecutive_nonfinite=3, peak_tflops_per_device=0.0), **overrides}))


def _fake_step(first_bad: int):
  """A train step whose updates turn non-finite from step `first_bad` on:
  like the real step, it then keeps the parameters and flags the leaf."""
  def step(state, batch):
    del batch
    bad = state["step"] + 1 >= first_bad
    params = {"w": jnp.where(bad, state["params"]["w"],
                             state["params"]["w"] + 1.0)}
    metrics = {"loss": jnp.where(bad, jnp.nan, 1.0),
               "skipped": bad.astype(jnp.float32),
               "nonfinite_grads": jnp.stack([bad])}
    return {"step": state["step"] + 1, "params": params}, metrics
  return jax.jit(step)


def _fit(tmp_path, first_bad, **config):
  config = _config(**config)
  state = {"step": jnp.zeros([], jnp.int32), "params": {"w": jnp.zeros(2)}}
  mngr = checkpoints.manager(str(tmp_path), async_save=False)
  batches = ((i, None) for i in range(config.num_train_steps))
  return mngr, loop.fit(loop.LoopOptions.from_config(config), loop.FitPlan(
      state=state, train_step=_fake_step(first_bad), batches=batches,
      start_step=0, resumed=False, mngr=mngr, workdir=str(tmp_path),
      evaluate=None, flops_per_step=1.0,
      rows_per_step=config.batch_size, tokens_per_sequence=4,
      param_paths=["w"]))


def test_fit_stops_after_consecutive_nonfinite_steps_and_saves(tmp_path):
  with pytest.raises(guards.NonFiniteError, match="Stopped at step 7") as e:
    _fit(tmp_path, first_bad=5)
  # The guard reads each step's flags one step late, so step 8 had already
  # run (and been skipped) when the run stopped; that state is saved, with
  # the parameters of the last finite step (4).
  assert f"saved as checkpoint 8 in {tmp_path}" in str(e.value)
  mngr = checkpoints.manager(str(tmp_path), async_save=False)
  assert mngr.latest_step() == 8
  abstract = {"step": jax.ShapeDtypeStruct([], jnp.int32),
              "params": {"w": jax.ShapeDtypeStruct((2,), jnp.float32)}}
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restored, _ = checkpoints.restore_latest(
      mngr, abstract, jax.tree.map(lambda _: sharding, abstract))
  np.testing.assert_array_equal(restored["params"]["w"], [4.0, 4.0])


def test_fit_counts_isolated_skips_and_finishes(tmp_path):
  """Fewer bad steps in a row than the limit: the run completes and reports
  how many it skipped."""
  _, out = _fit(tmp_path, first_bad=9, max_consecutive_nonfinite=5)
  assert out.preempted_at is None
  assert out.skipped_steps == 2
  assert int(out.state["step"]) == 10
  np.testing.assert_array_equal(out.state["params"]["w"], [8.0, 8.0])


def test_sigterm_during_a_long_evaluation_saves_within_seconds(tmp_path):
  """An evaluation of 200 batches × 50 ms (10 s) is cut short by SIGTERM:
  the run saves the step it reached and stops, in well under a second."""
  config = _config(eval_every_steps=4, checkpoint_every_steps=100)
  state = {"step": jnp.zeros([], jnp.int32), "params": {"w": jnp.zeros(2)}}
  mngr = checkpoints.manager(str(tmp_path), async_save=False)
  signalled = []

  def evaluate(st, step):
    del st, step
    signalled.append(time.time())
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    for _ in range(200):
      time.sleep(0.05)
    return {"accuracy": 1.0}

  out = loop.fit(loop.LoopOptions.from_config(config), loop.FitPlan(
      state=state, train_step=_fake_step(100),
      batches=((i, None) for i in range(config.num_train_steps)),
      start_step=0, resumed=False, mngr=mngr, workdir=str(tmp_path),
      evaluate=evaluate, flops_per_step=1.0,
      rows_per_step=config.batch_size, tokens_per_sequence=4,
      param_paths=["w"]))
  stopped = time.time() - signalled[0] - 0.2
  assert (out.preempted_at, out.stopped_by) == (4, "SIGTERM")
  assert out.last_eval == {}  # the cut-short evaluation reports nothing
  assert stopped < 2.0
  assert checkpoints.available_steps(str(tmp_path)) == [4]
  assert len(signalled) == 1


def test_loop_options_are_read_from_the_config_once():
  """`fit` takes typed options: a pre-training config's cadence, limits,
  seed, goodput and profile sections and loader settings; a fine-tuning
  config has no loader settings to name in a data stall."""
  c = config_lib.base_config(config_lib.tiny_model(), num_train_steps=30)
  c.seed, c.profile.num_steps = 5, 2
  options = loop.LoopOptions.from_config(c)
  assert (options.num_train_steps, options.log_every_steps,
          options.eval_every_steps, options.checkpoint_every_steps,
          options.max_consecutive_nonfinite, options.seed) == (
              30, c.log_every_steps, c.eval_every_steps,
              c.checkpoint_every_steps, c.max_consecutive_nonfinite, 5)
  assert options.goodput == goodput.GoodputOptions.from_config(c.goodput)
  assert options.profile == profiling.ProfileOptions.from_config(c.profile)
  assert options.profile.num_steps == 2
  assert options.loader_hint == (
      f"raise config.data.num_workers (now {c.data.num_workers}) or "
      f"config.data.prefetch (now {c.data.prefetch}), ")
  tuned = loop.LoopOptions.from_config(config_lib.classify_config())
  assert tuned.loader_hint == ""
