"""Pre-training loop: one `run(config, workdir)`, big_vision style.

Resumes automatically from the newest checkpoint in the workdir (parameters,
optimizer state, step and RNG; the data position is the step). SIGTERM
(preemption) finishes the current step, saves and exits cleanly.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import sharding as sharding_lib
from albert_jax import storage
from albert_jax import tree as tree_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import pipeline
from albert_jax.text import run_tokenizer
from albert_jax.training import config_check
from albert_jax.training import lease as lease_lib
from albert_jax.training import loop
from albert_jax.training import optimizer as optim
from albert_jax.training import profiling
from albert_jax.training import recipe
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

log = logging.getLogger(__name__)


def evaluate(eval_step, params, eval_loader, num_batches: int,
             metrics_from_sums, baseline_id: int | None = None
             ) -> dict[str, float]:
  """Eval metrics over `num_batches` fixed batches of the eval split.

  `metrics_from_sums` is the objective's `metrics`; with `baseline_id`,
  also the accuracy of always guessing that token at the masked positions.
  Where rows have sentence labels, also `sentence_majority_share`: the
  accuracy of always guessing the commoner label (a sentence head that
  learned nothing scores it, not 0.5). Baselines count this host's rows.
  """
  total = None
  hits = seen = 0.0
  labels = np.zeros(2, np.int64)
  for step in range(num_batches):
    batch = eval_loader.batch(step)
    sums = jax.device_get(eval_step(params, batch))
    total = sums if total is None else jax.tree.map(np.add, total, sums)
    local = eval_loader.local_batch(step)
    if baseline_id is not None:
      w = local["masked_weights"] > 0
      hits += float(np.sum((local["masked_ids"] == baseline_id) & w))
      seen += float(np.sum(w))
    labels += np.bincount(local["sentence_labels"][
        local["sentence_labels"] >= 0], minlength=2)[:2]
  out = {k: float(v) for k, v in metrics_from_sums(
      jax.tree.map(jnp.asarray, total)).items()}
  if baseline_id is not None:
    out["unigram_baseline_accuracy"] = hits / max(seen, 1.0)
  if labels.sum():
    out["sentence_majority_share"] = float(labels.max() / labels.sum())
  return out


def most_frequent_target(loader, num_batches: int = 4) -> int:
  """The unigram baseline's single guess: the commonest masked target."""
  counts = np.zeros(loader.vocab.size, np.int64)
  for step in range(num_batches):
    b = loader.local_batch(step)
    np.add.at(counts, b["masked_ids"][b["masked_weights"] > 0], 1)
  return int(np.argmax(counts))


def run(config, workdir: str) -> dict[str, Any]:
  """Pre-trains per `config` in `workdir`; returns the final metrics.

  The recipe is checked before anything is written (`recipe.check`), and the
  workdir is leased to this run while it trains (`lease.acquire`).
  """
  started_at = time.time()  # goodput counts the start-up from here
  config_check.check(config)
  profiling.check_can_trace(
      profiling.ProfileOptions.from_config(config.get("profile")))
  workdir = storage.as_str(workdir)
  storage.refuse_links_out(workdir)
  recipe.check(config, workdir)
  loop.prepare_workdir(workdir)
  with lease_lib.acquire(workdir,
                         config.get("take_over_workdir", False)) as lease:
    return _train(config, workdir, lease, started_at)


def _train(config, workdir: str, lease: lease_lib.Lease,
           started_at: float) -> dict[str, Any]:
  """`run`'s work, with the workdir checked and leased."""
  ##############################################################################
  # Tokenizer and prepared data.
  ##############################################################################
  mesh, rules = loop.mesh_and_rules(config)
  tokenizer = run_tokenizer.ensure(config, workdir)
  data_dir = pipeline.ensure_dataset(config, workdir, tokenizer)
  vocab = loader_lib.Vocabulary.from_tokenizer(tokenizer)

  ##############################################################################
  # Mesh, model and optimizer.
  ##############################################################################
  spec = run_spec.run_spec(config)
  objective = spec.objective
  tx, schedule = optim.make(config)
  seq_len = config.data.max_seq_length

  ##############################################################################
  # Train state: restored from the workdir, or created sharded.
  ##############################################################################
  start = loop.restore_or_create(
      config, workdir, state_lib.state_init_fn(spec.init_params, tx),
      tx, mesh, rules, best_metric=config.best_metric)
  state, shardings, mngr = start.state, start.shardings, start.mngr
  start_step = start.step
  loop.record_config(config, workdir)

  ##############################################################################
  # Data, steps and what users see.
  ##############################################################################
  data_sharding = sharding_lib.data_sharding(mesh)
  train_loader = pipeline.make_loader(config, data_dir, "train", vocab,
                                      data_sharding, masked=spec.masked)
  eval_loader = None
  if pipeline.has_split(data_dir, "eval") and config.eval_batches > 0:
    eval_loader = pipeline.make_loader(config, data_dir, "eval", vocab,
                                       data_sharding, seed=config.seed + 1,
                                       masked=spec.masked)
  train = step_lib.jit_train_step(
      step_lib.make_train_step(objective, tx, schedule,
                               config.accumulation_steps),
      shardings, mesh, rules, loop.compiler_options(config))
  eval_jit = jax.jit(step_lib.make_eval_step(objective),
                     in_shardings=(shardings["params"], data_sharding),
                     compiler_options=loop.compiler_options(config))

  def eval_step(params, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return eval_jit(params, batch)

  baseline_id = None
  if eval_loader is not None and spec.unigram_baseline:
    baseline_id = most_frequent_target(train_loader)

  def run_eval(st, step):
    del step
    return evaluate(eval_step, st["params"], eval_loader, config.eval_batches,
                    objective.metrics, baseline_id)

  ##############################################################################
  # Train loop.
  ##############################################################################
  out = loop.fit(config, loop.FitPlan(
      state=state, train_step=train, mngr=mngr, workdir=workdir,
      batches=train_loader.iterate(
          start_step, max(config.num_train_steps - start_step, 0)),
      start_step=start_step, resumed=start.resumed,
      evaluate=run_eval if eval_loader is not None else None,
      flops_per_step=spec.flops_per_step, tokens_per_sequence=seq_len,
      param_paths=list(tree_lib.flatten(state["params"])),
      best_key=config.best_metric, lease=lease, started_at=started_at))
  if out.preempted_at is not None:
    return {"preempted_at": out.preempted_at, "stopped_by": out.stopped_by,
            "goodput": out.goodput}
  final_step = int(jax.device_get(out.state["step"]))
  result = {"step": final_step, "skipped_steps": out.skipped_steps,
            **{f"eval_{k}": v for k, v in out.last_eval.items()},
            "goodput": out.goodput}
  if jax.process_index() == 0:
    storage.write_atomic(storage.path(workdir) / "final_metrics.json",
                         json.dumps(result, indent=2))
  return result
