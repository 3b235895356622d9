"""Pre-training loop: one `run(config, workdir)`, big_vision style.

Resumes automatically from the newest checkpoint in the workdir (parameters,
optimizer state, step and RNG; the data position is the step). SIGTERM
(preemption) finishes the current step, saves and exits cleanly.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import sharding as sharding_lib
from albert_jax.data import instances as instances_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import pipeline
from albert_jax.text import run_tokenizer
from albert_jax.training import optimizer as optim
from albert_jax.training import recipe as recipe_lib
from albert_jax.training import run_setup
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

  The config and recipe are checked before anything is written, and the
  workdir is leased to this run while it trains (`run_setup.start`).
  """
  with run_setup.start(config, workdir) as r:
    return _train(config, r)


def rows_per_step(config, data_dir: str, workdir: str, multiple: int) -> int:
  """The rows a training step takes.

  One instance a row: `batch_size`. Packed (`data.pack` = K): `batch_size`
  counts instances, as a fine-tune's counts examples, and a step takes the
  rows that hold that many on average (`instances.rows_per_step`, from the
  prepared train split's instances per row, rounded to a multiple of
  `multiple`, data-parallel size × accumulation steps). A packed run so
  keeps its recipe's instances per step, learning rate and epochs, and its
  steps are cheaper. The number is fixed when the run starts (its recipe
  records it) and a resume keeps it whatever the mesh; a workdir started
  before packed steps were counted in instances resumes with `batch_size`
  rows, what it trained with.

  Raises:
    ValueError: a resume whose recorded rows do not split over `multiple`.
  """
  if not config.data.pack:
    return config.batch_size
  recorded = recipe_lib.read(workdir)
  if recorded is not None:
    rows = int(recorded.get("rows_per_step", config.batch_size))
    if rows % multiple:
      raise ValueError(
          f"{workdir} trains {rows} packed rows a step (its "
          f"{recipe_lib.RECIPE}), which do not divide over the data-parallel "
          f"size × accumulation_steps ({multiple}) of this mesh; resume with "
          "a --config.mesh or --config.accumulation_steps that divides "
          f"{rows}.")
    return rows
  split = loader_lib.read_metadata(data_dir)["splits"]["train"]
  instances = int(split["instances"])
  packed = int(split.get("rows", instances))
  if not packed:
    return config.batch_size  # no train rows: the loader says so
  rows = instances_lib.rows_per_step(config.batch_size, instances, packed,
                                     multiple)
  log.info("Packed rows: %d a step hold batch_size=%d instances on average "
           "(%.2f a row).", rows, config.batch_size, instances / packed)
  return rows


def _train(config, r: run_setup.Run) -> dict[str, Any]:
  """`run`'s work, with the workdir checked and leased."""
  ##############################################################################
  # Tokenizer and prepared data.
  ##############################################################################
  tokenizer = run_tokenizer.ensure(config.data, r.workdir,
                                   vocab_size=config.model.vocab_size,
                                   seed=config.seed)
  data_dir = pipeline.ensure_dataset(config.data, r.workdir, tokenizer,
                                     seed=config.seed)
  vocab = loader_lib.Vocabulary.from_tokenizer(tokenizer)

  rows = rows_per_step(config, data_dir, r.workdir,
                       sharding_lib.data_parallel_size(r.mesh)
                       * config.accumulation_steps)

  ##############################################################################
  # Model and optimizer.
  ##############################################################################
  spec = run_spec.run_spec(config, batch_size=rows)
  objective = spec.objective
  tx, schedule = optim.make(config.optimizer, config.num_train_steps)

  ##############################################################################
  # Train state: restored from the workdir, or created sharded.
  ##############################################################################
  start = r.restore_or_create(state_lib.state_init_fn(spec.init_params, tx),
                              tx, best_metric=config.best_metric)
  r.record_config(rows if config.data.pack else None)

  ##############################################################################
  # Data, steps and what users see.
  ##############################################################################
  masking = config.masking if spec.masked else None
  train_loader = pipeline.make_loader(
      config.data, masking, data_dir, "train", vocab, r.data_sharding,
      global_batch_size=rows, seed=config.seed)
  eval_loader = None
  if pipeline.has_split(data_dir, "eval") and config.eval_batches > 0:
    eval_loader = pipeline.make_loader(
        config.data, masking, data_dir, "eval", vocab, r.data_sharding,
        global_batch_size=rows, seed=config.seed + 1)
  train = r.jit_train_step(objective, tx, schedule, start.shardings)
  eval_step = sharding_lib.jit_in_mesh(
      step_lib.make_eval_step(objective), r.mesh, r.rules,
      in_shardings=(start.shardings["params"], r.data_sharding),
      compiler_options=r.compiler_options)
  baseline_id = None
  if eval_loader is not None and spec.unigram_baseline:
    baseline_id = most_frequent_target(train_loader)

  def run_eval(st, step):
    del step
    return evaluate(eval_step, st["params"], eval_loader, config.eval_batches,
                    objective.metrics, baseline_id)

  ##############################################################################
  # Train loop and final metrics.
  ##############################################################################
  out = r.fit(start, train, train_loader,
              evaluate=run_eval if eval_loader is not None else None,
              flops_per_step=spec.flops_per_step, rows_per_step=rows,
              tokens_per_sequence=config.data.max_seq_length,
              best_key=config.best_metric)
  if out.preempted_at is not None:
    return run_setup.stopped_early(out)
  result = {"step": int(jax.device_get(out.state["step"])),
            "skipped_steps": out.skipped_steps,
            **{f"eval_{k}": v for k, v in out.last_eval.items()},
            "goodput": out.goodput}
  r.write_final_metrics(result)
  return result
