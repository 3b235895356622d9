"""Goodput: every second of a session booked to one cause, sessions of a
workdir added up, lost progress after a restart, slow steps and data stalls.

`Account` is checked with a scripted clock (exact seconds); `loop.fit` with a
fake train step and a loader that sleeps, against the test's own clock.
"""

import json
import logging
import time

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from albert_jax.training import checkpoints
from albert_jax.training import defaults
from albert_jax.training import goodput
from albert_jax.training import loop
from albert_jax.training import metrics


class Clock:
  """A clock the test moves by hand."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now

  def tick(self, seconds):
    self.now += seconds


def _account(workdir, clock, start_step, **options):
  return goodput.Account(str(workdir), goodput.GoodputOptions(**options),
                         start_step=start_step, started_at=clock.now,
                         clock=clock)


def test_sessions_add_up_and_redone_steps_are_lost_progress(tmp_path):
  clock = Clock()
  first = _account(tmp_path, clock, start_step=0)
  clock.tick(5)
  first.book("startup")
  for done in range(1, 9):  # steps 1-8; the first one compiles
    clock.tick(0.5)
    first.data_waited()
    clock.tick(20 if done == 1 else 1)
    first.step_done(done)
  clock.tick(100)  # killed after step 8: never booked, its record as of 8
  second = _account(tmp_path, clock, start_step=6)  # resumed from 6
  assert second.reached_before == 8
  clock.tick(3)
  second.book("startup")
  for done in range(7, 11):  # 7 compiles, 8 is redone, 9 and 10 are new
    clock.tick(2)
    second.step_done(done)
  clock.tick(4)
  second.book("checkpoint")
  second.save()
  s = second.summary()
  assert s["seconds"] == dict(
      startup=5 + 3, compile=20 + 2, productive=7 * 1 + 2 * 2,
      data_wait=8 * 0.5, checkpoint=4, evaluation=0, lost_progress=2,
      profiling=0, idle=0)
  assert (s["sessions"], s["lost_steps"], s["wall_seconds"]) == (2, 2, 51)
  assert s["goodput_percent"] == pytest.approx(100 * 11 / 51)
  assert sum(s["percent"].values()) == pytest.approx(100)
  record = json.loads((tmp_path / goodput.GOODPUT_FILE).read_text())
  assert [e["reached"] for e in record["sessions"]] == [8, 10]
  lines = metrics.goodput_lines(s)
  assert lines[0] == "Goodput 21.6% of 0:51 wall time over 2 sessions."
  assert lines[1].startswith("Badput: compile 43.1% (22.0 s), startup 15.7% "
                             "(8.0 s), data wait 7.8% (4.0 s), ")
  assert lines[2] == ("Lost progress: 2 steps run again after a restart "
                      "(past the checkpoint resumed from).")


def test_a_session_that_runs_no_step_is_left_out(tmp_path):
  """A rerun of a finished run trains nothing: the record and the summary
  stay those of the run."""
  clock = Clock()
  first = _account(tmp_path, clock, start_step=0)
  for done in (1, 2):
    clock.tick(1)
    first.step_done(done)
  before = (tmp_path / goodput.GOODPUT_FILE).read_text()
  rerun = _account(tmp_path, clock, start_step=2)
  clock.tick(7)
  rerun.book("evaluation")
  rerun.save()
  assert (tmp_path / goodput.GOODPUT_FILE).read_text() == before
  assert rerun.summary() == first.summary()
  assert metrics.goodput_lines(_account(tmp_path / "new", clock, 0).summary(
      )) == []


def test_slow_steps_are_counted_by_number(tmp_path):
  clock = Clock()
  account = _account(tmp_path, clock, start_step=0, slow_step_factor=3.0)
  for done in range(1, 31):
    clock.tick({1: 50, 12: 3.5, 20: 2.9, 25: 10}.get(done, 1.0))
    account.step_done(done)
  s = account.summary()
  assert (s["slow_step_count"], s["slow_steps"]) == (2, [12, 25])
  assert metrics.goodput_lines(s)[-1] == (
      "2 slow steps (over config.goodput.slow_step_factor × the median): "
      "12, 25.")


def test_a_damaged_record_is_set_aside(tmp_path, caplog):
  (tmp_path / goodput.GOODPUT_FILE).write_text('{"sessions": [')
  with caplog.at_level(logging.WARNING):
    account = _account(tmp_path, Clock(), start_step=0)
  assert account.earlier == [] and "goodput.json is damaged" in caplog.text
  assert (tmp_path / "goodput.json.damaged").read_text() == '{"sessions": ['


def _config(**overrides):
  return ml_collections.ConfigDict(defaults.upgrade({**dict(
      num_train_steps=12, log_every_steps=4, eval_every_steps=100,
      checkpoint_every_steps=6, batch_size=2, seed=0,
      max_consecutive_nonfinite=3, peak_tflops_per_device=0.0,
      data=dict(num_workers=1, prefetch=2),
      goodput=dict(data_stall_share=0.1, slow_step_factor=3.0)),
      **overrides}))


@jax.jit
def _step(state, batch):
  del batch
  return ({"step": state["step"] + 1, "params": state["params"]},
          {"loss": jnp.float32(1), "skipped": jnp.float32(0),
           "nonfinite_grads": jnp.zeros(1, bool)})


def _slow_batches(steps, seconds):
  for i in range(steps):
    time.sleep(seconds)
    yield i, None


def test_fit_accounts_for_its_wall_time_and_names_a_data_stall(tmp_path,
                                                               caplog):
  """A loader that takes 30 ms a batch, steps that take none: goodput's
  causes add up to the wall time the test measures (within 2%), and the stall
  is named once, with the fix."""
  config = _config()
  state = {"step": jnp.zeros([], jnp.int32), "params": {"w": jnp.zeros(2)}}
  mngr = checkpoints.manager(str(tmp_path), async_save=False)
  started = time.time()
  time.sleep(0.2)  # start-up
  with caplog.at_level(logging.WARNING):
    out = loop.fit(loop.LoopOptions.from_config(config), loop.FitPlan(
        state=state, train_step=_step,
        batches=_slow_batches(12, 0.03), start_step=0, resumed=False,
        mngr=mngr, workdir=str(tmp_path), evaluate=None, flops_per_step=1.0,
        rows_per_step=config.batch_size, tokens_per_sequence=4,
        param_paths=["w"], started_at=started))
  wall = time.time() - started
  g = out.goodput
  assert sum(g["seconds"].values()) == pytest.approx(wall, rel=0.02)
  assert g["wall_seconds"] == pytest.approx(wall, rel=0.02)
  assert g["seconds"]["startup"] >= 0.2
  assert g["seconds"]["data_wait"] >= 12 * 0.03
  assert g["seconds"]["checkpoint"] > 0  # steps 6 and 12 were saved
  assert g["sessions"] == 1 and g["lost_steps"] == 0
  stalls = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("Data stall")]
  assert len(stalls) == 1, stalls
  assert "raise config.data.num_workers (now 1)" in stalls[0]
  assert "albert_jax.data.prepare" in stalls[0]
  logged = [json.loads(line) for line in
            (tmp_path / "tensorboard" / "metrics.jsonl").read_text(
                ).splitlines()]
  assert {"goodput/percent", "badput/data_wait_percent"} <= set(logged[-1])


def test_a_fast_loader_is_not_a_stall(tmp_path, caplog):
  config = _config()
  state = {"step": jnp.zeros([], jnp.int32), "params": {"w": jnp.zeros(2)}}
  mngr = checkpoints.manager(str(tmp_path), async_save=False)
  def step(state, batch):
    time.sleep(0.1)  # the steps take the time, not the loader
    return _step(state, batch)

  with caplog.at_level(logging.WARNING):
    loop.fit(loop.LoopOptions.from_config(config), loop.FitPlan(
        state=state, train_step=step,
        batches=((i, None) for i in range(12)), start_step=0,
        resumed=False, mngr=mngr, workdir=str(tmp_path), evaluate=None,
        flops_per_step=1.0,
        rows_per_step=config.batch_size, tokens_per_sequence=4,
        param_paths=["w"]))
  assert "Data stall" not in caplog.text
