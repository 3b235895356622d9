"""Pre-training loop: one `run(config, workdir)`, big_vision style.

Resumes automatically from the newest checkpoint in the workdir (parameters,
optimizer state, step and RNG; the data position is the step). SIGTERM
(preemption) finishes the current step, saves and exits cleanly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import checkpoints
from albert_jax import flops as flops_lib
from albert_jax import metrics as metrics_lib
from albert_jax import models
from albert_jax import objectives
from albert_jax import optim
from albert_jax import sharding as sharding_lib
from albert_jax import train_step as step_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import pipeline
from albert_jax.model_config import ModelConfig

log = logging.getLogger(__name__)


def heads_for(objective: str) -> tuple[str, ...]:
  return ("mlm", "sop") if objective in ("sop", "nsp") else ("mlm",)


def git_commit() -> str:
  try:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=os.path.dirname(__file__),
        capture_output=True, text=True, check=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def prepare_workdir(workdir: str) -> None:
  """Creates the workdir, failing early and clearly if it is not writable."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, ".write_test")
    with open(probe, "w", encoding="utf-8") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise PermissionError(
        f"Cannot write to workdir {workdir} ({e.strerror}); choose a "
        "directory you can write, e.g. --workdir=/tmp/albert_run.") from e


def record_config(config, workdir: str) -> None:
  """Writes the resolved config and the git commit beside the checkpoints.

  Called once the state is known to fit the config, so a rerun with another
  config cannot leave a config.json that does not describe the checkpoints.
  """
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
      f.write(config.to_json_best_effort(indent=2))
    with open(os.path.join(workdir, "git_commit.txt"), "w",
              encoding="utf-8") as f:
      f.write(git_commit() + "\n")


class _Preemption:
  """Turns SIGTERM into a flag the loop checks between steps."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    def handler(signum, frame):
      del signum, frame
      self.requested = True
    try:
      self._previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
      self._previous = None
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

  def agreed(self) -> bool:
    """All hosts stop together, or none does."""
    if jax.process_count() == 1:
      return self.requested
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    flags = multihost_utils.process_allgather(np.asarray(self.requested))
    return bool(np.any(flags))


def evaluate(eval_step, params, eval_loader, num_batches: int,
             baseline_id: int | None = None) -> dict[str, float]:
  """Eval metrics over `num_batches` fixed batches of the eval split."""
  total = None
  hits = seen = 0.0
  for step in range(num_batches):
    batch = eval_loader.batch(step)
    sums = jax.device_get(eval_step(params, batch))
    total = sums if total is None else jax.tree.map(np.add, total, sums)
    if baseline_id is not None:
      local = eval_loader.local_batch(step)
      w = local["masked_weights"] > 0
      hits += float(np.sum((local["masked_ids"] == baseline_id) & w))
      seen += float(np.sum(w))
  out = {k: float(v) for k, v in objectives.metrics_from_sums(
      jax.tree.map(jnp.asarray, total)).items()}
  if baseline_id is not None:
    out["unigram_baseline_accuracy"] = hits / max(seen, 1.0)
  return out


def most_frequent_target(loader, num_batches: int = 4) -> int:
  """The unigram baseline's single guess: the commonest masked target."""
  counts = np.zeros(loader.vocab.size, np.int64)
  for step in range(num_batches):
    b = loader.local_batch(step)
    np.add.at(counts, b["masked_ids"][b["masked_weights"] > 0], 1)
  return int(np.argmax(counts))


def run(config, workdir: str) -> dict[str, Any]:
  """Pre-trains per `config` in `workdir`; returns the final metrics."""
  ##############################################################################
  # Workdir, tokenizer and prepared data.
  ##############################################################################
  prepare_workdir(workdir)
  tokenizer = pipeline.ensure_tokenizer(config, workdir)
  data_dir = pipeline.ensure_dataset(config, workdir, tokenizer)
  vocab = loader_lib.Vocabulary.from_tokenizer(tokenizer)

  ##############################################################################
  # Mesh, model and optimizer.
  ##############################################################################
  mesh = sharding_lib.make_mesh(config.mesh)
  rules = sharding_lib.rules_for(mesh, [tuple(r) for r in config.sharding_rules])
  dp = sharding_lib.data_parallel_size(mesh)
  if config.batch_size % (dp * config.accumulation_steps):
    raise ValueError(
        f"batch_size {config.batch_size} must be divisible by the "
        f"data-parallel size ({dp}) × accumulation_steps "
        f"({config.accumulation_steps}).")
  model_config = ModelConfig.from_dict(config.model)
  heads = heads_for(config.data.objective)
  model = models.Albert(model_config, heads=heads)
  tx, schedule = optim.make(config)
  seq_len = config.data.max_seq_length
  num_predictions = config.masking.max_predictions

  ##############################################################################
  # Train state: restored from the workdir, or created sharded.
  ##############################################################################
  rng = jax.random.key(config.seed)
  init = step_lib.init_fn(model, tx, seq_len, num_predictions)
  abstract_boxed = jax.eval_shape(init, rng)
  shardings = step_lib.state_shardings(abstract_boxed, tx, mesh, rules)
  abstract = {**abstract_boxed,
              "params": nn.meta.unbox(abstract_boxed["params"])}
  mngr = checkpoints.manager(
      workdir, keep=config.keep_checkpoints, best_metric=config.best_metric,
      async_save=config.async_checkpoints)
  restored = checkpoints.restore_latest(mngr, abstract, shardings)
  if restored is not None:
    state, _ = restored
    log.info("Resumed from step %d in %s.", int(state["step"]), workdir)
  else:
    state, _ = step_lib.create_state(model, tx, mesh, rules, rng, seq_len,
                                     num_predictions)
  start_step = int(jax.device_get(state["step"]))
  record_config(config, workdir)

  ##############################################################################
  # Data, steps and what users see.
  ##############################################################################
  data_sharding = sharding_lib.data_sharding(mesh)
  train_loader = pipeline.make_loader(config, data_dir, "train", vocab,
                                      data_sharding)
  eval_loader = None
  if pipeline.has_split(data_dir, "eval") and config.eval_batches > 0:
    eval_loader = pipeline.make_loader(config, data_dir, "eval", vocab,
                                       data_sharding, seed=config.seed + 1)
  train = step_lib.jit_train_step(
      step_lib.make_train_step(model, tx, schedule, config.accumulation_steps),
      shardings, mesh, rules)
  eval_jit = jax.jit(step_lib.make_eval_step(model),
                     in_shardings=(shardings["params"], data_sharding))

  def eval_step(params, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return eval_jit(params, batch)

  flops_per_step = flops_lib.training_flops_per_step(
      model_config, config.batch_size, seq_len, num_predictions,
      heads=heads)
  peak = metrics_lib.peak_tflops(jax.devices()[0].device_kind,
                                 config.peak_tflops_per_device)
  is_main = jax.process_index() == 0
  writer = metrics_lib.Writer(os.path.join(workdir, "tensorboard"),
                              enabled=is_main)
  progress = metrics_lib.Progress(config.num_train_steps, start_step,
                                  every=config.log_every_steps,
                                  enabled=is_main)
  baseline_id = (most_frequent_target(train_loader) if eval_loader else None)
  last_eval: dict[str, float] = {}
  last_eval_step = -1

  def run_eval(step):
    nonlocal last_eval, last_eval_step
    if eval_loader is None:
      return
    last_eval = evaluate(eval_step, state["params"], eval_loader,
                         config.eval_batches, baseline_id)
    last_eval_step = step
    writer.write(step, {f"eval/{k}": v for k, v in last_eval.items()})

  saved = {start_step} if restored is not None else set()

  def save(step, force=False):
    if step in saved:  # e.g. SIGTERM right after a periodic save
      return
    meta = {"step": step, "data_position": step, "seed": config.seed}
    # Only this step's own eval may rank it for "best" retention.
    metrics = last_eval if last_eval_step == step else None
    checkpoints.save(mngr, state, meta, metrics=metrics, force=force)
    saved.add(step)

  ##############################################################################
  # Train loop.
  ##############################################################################
  remaining = config.num_train_steps - start_step
  t_last, s_last = time.time(), start_step
  with _Preemption() as preemption:
    for step, batch in train_loader.iterate(start_step, max(remaining, 0)):
      state, m = train(state, batch)
      done = step + 1
      last = done == config.num_train_steps
      if done % config.log_every_steps == 0 or last:
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        now = time.time()
        dt = (now - t_last) / max(done - s_last, 1)
        t_last, s_last = now, done
        m["seq_per_sec"] = config.batch_size / dt
        m["tokens_per_sec"] = config.batch_size * seq_len / dt
        m["step_time"] = dt
        if peak:
          m["mfu"] = flops_lib.mfu(flops_per_step, dt,
                                   peak * 1e12 * jax.device_count())
        writer.write(done, {f"train/{k}": v for k, v in m.items()})
        progress.update(done, m)
      if done % config.eval_every_steps == 0 and not last:
        run_eval(done)
      if done % config.checkpoint_every_steps == 0 and not last:
        save(done)
      if preemption.agreed():
        log.warning("SIGTERM: saving step %d and stopping.", done)
        save(done, force=True)
        mngr.wait_until_finished()
        writer.close()
        return {"preempted_at": done}

    ############################################################################
    # Final evaluation and checkpoint (a SIGTERM now waits for the save).
    ############################################################################
    final_step = int(jax.device_get(state["step"]))
    run_eval(final_step)
    save(final_step, force=True)
    mngr.wait_until_finished()
  writer.close()
  result = {"step": final_step, **{f"eval_{k}": v for k, v in
                                   last_eval.items()}}
  if is_main:
    with open(os.path.join(workdir, "final_metrics.json"), "w",
              encoding="utf-8") as f:
      json.dump(result, f, indent=2)
  return result
