"""Fine-tuning: one `run(config, workdir)` for every task.

The task (`config.data.task`) supplies data, head, loss, metrics and
prediction files; the model starts from `config.init` (anything
`load_pretrained` takes: an albert_jax workdir, an HF directory, an official
TF release) with `config.model`'s non-empty fields as overrides (dropout,
dtype, attention kernel). Everything else is the pre-training machinery: the
same mesh and sharding rules, optimizer, train step (with the task as its
objective), loop, checkpoints and metrics. At the end the best checkpoint by
the task's metric writes the prediction files into `workdir/predictions`.
The workdir, `config.init` and the data files may be local paths or
gs://BUCKET/PATH (`albert_jax.storage`).

`config.lm_aux_weight` λ > 0 fine-tunes a causal (GPT) model as GPT-1 did
(Radford et al. 2018, sec. 3.2; λ = 0.5 there): the task loss plus λ × the
next-token loss on the task rows' own input text, through the pre-trained
"lm" head tied to the word embeddings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from albert_jax import sharding as sharding_lib
from albert_jax import storage
from albert_jax import tree as tree_lib
from albert_jax.finetune import batching
from albert_jax.finetune.data_files import check_data
from albert_jax.finetune import packing
from albert_jax.finetune import predict as predict_lib
from albert_jax.finetune import registry
from albert_jax.finetune import spec as spec_lib
from albert_jax.finetune import start as start_lib
from albert_jax.finetune.task import Split
from albert_jax.finetune.task import Task
from albert_jax.finetune.task import TaskObjective
from albert_jax.model.config import ModelConfig
from albert_jax.training import checkpoints
from albert_jax.training import config_check
from albert_jax.training import lease as lease_lib
from albert_jax.training import loop
from albert_jax.training import optimizer as optim
from albert_jax.training import profiling
from albert_jax.training import recipe
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

log = logging.getLogger(__name__)


def _predict_split(predict, params, split, batch_size, data_sharding,
                   pack: int = 0):
  """Predictions for all of a split's rows, padding dropped, in row order;
  with `pack`, run on packed rows and put back in the examples' order."""
  features = packing.pack(split.features, pack) if pack else split.features
  batches = batching.ArrayBatches(features, batch_size,
                                  sharding=data_sharding)
  parts = [jax.device_get(predict(params, b))
           for b in batches.eval_batches()]
  rows = batches.num_rows
  preds = {k: np.concatenate([p[k] for p in parts])[:rows] for k in parts[0]}
  if pack:
    preds = packing.unpack(preds, features[packing.SLOT_INDEX],
                           split.num_rows)
  return preds


def _majority_label(split) -> int | None:
  """The commonest training label of a classification task (the baseline
  that always predicts it), or None for other label kinds."""
  labels = split.features.get("labels")
  if labels is None or labels.ndim != 1 or not np.issubdtype(
      labels.dtype, np.integer):
    return None
  valid = labels[labels >= 0]
  return int(np.argmax(np.bincount(valid))) if valid.size else None


def data_name(config, task: Task) -> str:
  """What a run fine-tunes on, as its summary names it: the user's file (the
  one `data.split_from` cut up, else `data.train_file`) or the task's
  dataset ("glue/mrpc")."""
  source = config.data.get("split_from") or config.data.get("train_file")
  return storage.path(source).name if source else task.name


@dataclasses.dataclass(frozen=True)
class _Setup:
  """What a run fine-tunes: the task, the starting model and the data."""
  task: Task
  model_config: ModelConfig
  encoder: Any  # pre-trained encoder params (`encoder_start`), or None
  tokenizer: Any
  lm_weight: float  # `lm_aux_weight`
  seq_len: int
  train_split: Split
  eval_splits: list[Split]
  spec: spec_lib.FineTuneSpec  # the model trained, built once
  pack: int = 0  # examples per row (`config.data.pack`; 0: one)

  @property
  def best_key(self) -> str:
    """The eval metric that picks the best checkpoint ("<split>/<metric>"
    with several eval splits)."""
    if len(self.eval_splits) == 1:
      return self.task.metric
    return f"{self.eval_splits[0].name}/{self.task.metric}"

  def metric_prefix(self, split_name: str) -> str:
    """"" for the only eval split, else "<split>/"."""
    return ("" if len(self.eval_splits) == 1
            and split_name == self.eval_splits[0].name else f"{split_name}/")


def run(config, workdir: str,
        lease: lease_lib.Lease | None = None) -> dict[str, Any]:
  """Fine-tunes per `config` in `workdir`; returns the final metrics.

  `lease`: the workdir's, when the caller already holds it (else taken
  here).
  """
  started_at = time.time()  # goodput counts the start-up from here
  # The same checks as a pre-training run's (the task's name is the
  # registry's to check, when the task is made; the CLI checks it first).
  config_check.check(config)
  profiling.check_can_trace(
      profiling.ProfileOptions.from_config(config.get("profile")))
  workdir = storage.as_str(workdir)
  storage.refuse_links_out(workdir)
  check_data(config, workdir)
  recipe.check(config, workdir)
  loop.prepare_workdir(workdir)
  if lease is not None:
    return _run(config, workdir, lease, started_at)
  with lease_lib.acquire(workdir,
                         config.get("take_over_workdir", False)) as lease:
    return _run(config, workdir, lease, started_at)


def _run(config, workdir: str, lease: lease_lib.Lease,
         started_at: float) -> dict[str, Any]:
  """`run`'s work, with the workdir checked and leased."""
  mesh, rules = loop.mesh_and_rules(config)
  setup = _setup(config)
  objective, tx, schedule, start = _start_state(config, workdir, setup, mesh,
                                                rules)
  loop.record_config(config, workdir)
  record = functools.partial(
      predict_lib.record, workdir, setup.task, setup.model_config,
      setup.tokenizer, setup.seq_len, setup.lm_weight > 0)
  record()  # a checkpoint can be reloaded for prediction while training
  data_sharding = sharding_lib.data_sharding(mesh)
  train, predict = _steps(config, setup, objective, tx, schedule,
                          start.shardings, mesh, rules, data_sharding)
  eval_batch = config.get("eval_batch_size") or config.batch_size
  out = _fit(config, workdir, setup, start, train, evaluate=_evaluator(
      setup, predict, eval_batch, data_sharding), data_sharding=data_sharding,
             lease=lease, started_at=started_at)
  if out.preempted_at is not None:
    return {"preempted_at": out.preempted_at, "stopped_by": out.stopped_by,
            "goodput": out.goodput}
  final_step, best_step, params = _best_params(workdir, out, start)
  best_eval, written = _best_predictions(
      setup, predict, params, eval_batch, data_sharding,
      os.fspath(storage.path(workdir) / "predictions"))
  record()  # again: evaluation tuned settings (SQuAD v2.0's threshold)
  result = {"task": setup.task.name, "data": data_name(config, setup.task),
            "step": final_step, "best_step": best_step,
            "skipped_steps": out.skipped_steps,
            **{f"eval_{k}": v for k, v in best_eval.items()},
            "predictions": written, "goodput": out.goodput}
  if jax.process_index() == 0:
    storage.write_atomic(storage.path(workdir) / "final_metrics.json",
                         json.dumps(result, indent=2))
  return result


def _setup(config) -> _Setup:
  """The task, the starting model (`encoder_start`) and the training and
  eval splits, tokenised."""
  task = registry.make_task(config.data.task, config.data)
  model_config, encoder, tokenizer = start_lib.encoder_start(config)
  lm_weight = start_lib.lm_aux_weight(config, model_config)
  seq_len = config.data.max_seq_length
  pack = packing.check_pack(config.data.get("pack", 0))
  spec_lib.check_pack(task, pack, lm_weight > 0)  # before reading the data
  train_split = task.load(task.train_split, tokenizer, seq_len)
  eval_splits = [task.load(s, tokenizer, seq_len) for s in task.eval_splits]
  log.info("%s: %d training rows; eval %s.", task.name, train_split.num_rows,
           ", ".join(f"{s.name} {s.num_rows}" for s in eval_splits))
  return _Setup(task, model_config, encoder, tokenizer, lm_weight, seq_len,
                train_split, eval_splits,
                spec_lib.for_task(task, model_config, seq_len,
                                  lm_head=lm_weight > 0, pack=pack), pack)


def _start_state(config, workdir: str, setup: _Setup, mesh, rules):
  """(objective, tx, schedule, `loop.StartState`): the model with the task's
  head, its optimizer and the train state, restored from the workdir's
  newest checkpoint, else fresh with the pre-trained encoder placed in."""
  objective = TaskObjective(setup.spec.model, setup.task, setup.lm_weight)
  tx, schedule = optim.make(config)
  init = state_lib.state_init_fn(setup.spec.init_params, tx)
  encoder = setup.encoder
  required = ("lm",) if setup.lm_weight > 0 else ()
  start = loop.restore_or_create(
      config, workdir, init, tx, mesh, rules, best_metric=setup.best_key,
      on_create=None if encoder is None else (
          lambda st, sh: start_lib.place_encoder(st, sh, encoder,
                                                 required=required)))
  return objective, tx, schedule, start


def _steps(config, setup: _Setup, objective, tx, schedule, shardings, mesh,
           rules, data_sharding):
  """(train step, predict): the jitted train step and
  predict(params, batch) → the task's predictions, replicated."""
  train = step_lib.jit_train_step(
      step_lib.make_train_step(objective, tx, schedule,
                               config.accumulation_steps),
      shardings, mesh, rules, loop.compiler_options(config))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  predict_jit = jax.jit(
      lambda p, b: setup.task.predict(objective.outputs(p, b, None, True), b),
      in_shardings=(shardings["params"], data_sharding),
      out_shardings=replicated,
      compiler_options=loop.compiler_options(config))

  def predict(params, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return predict_jit(params, batch)
  return train, predict


def _evaluator(setup: _Setup, predict, eval_batch: int, data_sharding):
  """The loop's evaluate(state, step): every eval split's task metrics,
  named as `_Setup.metric_prefix` says."""
  def evaluate(st, step):
    del step
    out = {}
    for split in setup.eval_splits:
      preds = _predict_split(predict, st["params"], split, eval_batch,
                             data_sharding, setup.pack)
      metrics = setup.task.evaluate(preds, split)
      prefix = setup.metric_prefix(split.name)
      out.update({f"{prefix}{k}": float(v) for k, v in metrics.items()})
    return out
  return evaluate


def _fit(config, workdir: str, setup: _Setup, start, train, *, evaluate,
         lease, data_sharding, started_at: float) -> loop.FitResult:
  """The training loop (`loop.fit`) from `start` to
  `config.num_train_steps`, over shuffled training batches."""
  start_step = start.step
  features = setup.train_split.features
  if setup.pack:
    features = packing.pack(features, setup.pack)
    log.info("Packed %d training examples into %d rows of up to %d: "
             "padding %.1f%% of positions (%.1f%% one per row).",
             setup.train_split.num_rows, len(features["input_ids"]),
             setup.pack, 100 * packing.padding_fraction(features),
             100 * packing.padding_fraction(setup.train_split.features))
  train_batches = batching.ArrayBatches(
      features, config.batch_size, sharding=data_sharding, seed=config.seed)
  return loop.fit(config, loop.FitPlan(
      state=start.state, train_step=train, mngr=start.mngr,
      workdir=workdir, batches=train_batches.iterate(
          start_step, max(config.num_train_steps - start_step, 0)),
      start_step=start_step, resumed=start.resumed, evaluate=evaluate,
      flops_per_step=setup.spec.flops_per_step(config.batch_size),
      tokens_per_sequence=setup.spec.tokens_per_row,
      param_paths=list(tree_lib.flatten(start.state["params"])),
      best_key=setup.best_key, lease=lease, started_at=started_at))


def _best_params(workdir: str, out, start) -> tuple[int, int, Any]:
  """(final step, best step, the best step's params, sharded): the best
  checkpoint by the eval metric (the final step where none is marked)."""
  final_step = int(jax.device_get(out.state["step"]))
  best_step = start.mngr.best_step() or final_step
  params = out.state["params"]
  if best_step != final_step:
    params, _ = checkpoints.restore_params(
        workdir, start.abstract["params"], step=best_step,
        sharding=None)
    params = jax.device_put(params, start.shardings["params"])
  return final_step, best_step, params


def _best_predictions(setup: _Setup, predict, params, eval_batch: int,
                      data_sharding, pred_dir: str
                      ) -> tuple[dict[str, float], list[str]]:
  """(metrics, files written): `params`' predictions on every eval and
  predict split, written into `pred_dir` (by process 0); labelled splits are
  scored, with the majority-label baseline for classification."""
  task = setup.task
  written = []
  best_eval = {}
  if jax.process_index() == 0:
    storage.path(pred_dir).mkdir(parents=True, exist_ok=True)
  names = list(task.eval_splits) + [s for s in task.predict_splits
                                    if s not in task.eval_splits]
  majority = _majority_label(setup.train_split)
  for name in names:
    split = next((s for s in setup.eval_splits if s.name == name), None) or (
        task.load(name, setup.tokenizer, setup.seq_len))
    preds = _predict_split(predict, params, split, eval_batch, data_sharding,
                           setup.pack)
    if split.has_labels:
      prefix = setup.metric_prefix(name)
      best_eval.update({f"{prefix}{k}": float(v)
                        for k, v in task.evaluate(preds, split).items()})
      if majority is not None:
        best_eval[f"{prefix}majority_baseline_accuracy"] = float(np.mean(
            split.features["labels"] == majority))
    if jax.process_index() == 0:
      written += task.write_predictions(preds, split, pred_dir)
  return best_eval, written
