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

import contextlib
import dataclasses
import functools
import logging
import os
from typing import Any

import jax
import numpy as np

from albert_jax import sharding as sharding_lib
from albert_jax import storage
from albert_jax.finetune import batching
from albert_jax.finetune import data_files
from albert_jax.finetune import packing
from albert_jax.finetune import registry
from albert_jax.finetune import spec as spec_lib
from albert_jax.finetune import starting_point as start_lib
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.finetune.task import Split
from albert_jax.finetune.task import Task
from albert_jax.finetune.task import TaskObjective
from albert_jax.model.config import ModelConfig
from albert_jax.training import checkpoints
from albert_jax.training import config_check
from albert_jax.training import defaults
from albert_jax.training import lease as lease_lib
from albert_jax.training import optimizer as optim
from albert_jax.training import run_setup
from albert_jax.training import state as state_lib

log = logging.getLogger(__name__)


def _predict_split(predict, params, split, batch_size, data_sharding,
                   pack: int = 0, token_keys: tuple[str, ...] = ()):
  """Predictions for all of a split's rows, padding dropped, in row order;
  with `pack`, run on packed rows and put back in the examples' order
  (`token_keys`: the task's per-token features and predictions)."""
  features = (packing.pack(split.features, pack, token_keys) if pack
              else split.features)
  batches = batching.ArrayBatches(features, batch_size,
                                  sharding=data_sharding)
  parts = [jax.device_get(predict(params, b))
           for b in batches.eval_batches()]
  rows = batches.num_rows
  preds = {k: np.concatenate([p[k] for p in parts])[:rows] for k in parts[0]}
  if pack:
    preds = packing.unpack(preds, features, split.num_rows, token_keys)
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
  pack: int = 0  # examples per row (`spec.pack_for`; 0: one)

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

  The same checks and set-up as a pre-training run's (`run_setup.start`),
  and the task's data files; the task's name is the registry's to check,
  when the task is made (the CLI checks it first).

  `lease`: the workdir's, when the caller already holds it (else taken
  here).

  With `data.split_from` (a labelled file; "bundled/..." names one shipped
  in albert_jax/data/bundled), the file is first cut into stratified
  WORKDIR/data/{train,eval,test} files (`data_files.split_in_workdir`),
  holding the workdir's lease, so a second launch never rewrites the files
  a running fine-tune reads, and before the run's own checks, so they (the
  recipe's included) see the files it trains on. Another source than the
  workdir's run was cut from is refused before anything is written.
  """
  # A copy: the cut points its data files into the workdir.
  config = config.copy_and_resolve_references()
  if not config.data.get("split_from"):
    return _started(config, workdir, lease)
  defaults.fill(config)
  config_check.check(config, choices=registry.config_choices())
  workdir = storage.as_str(workdir)
  storage.refuse_links_out(workdir)
  _check_data(config, workdir)  # before the cut rewrites WORKDIR/data
  run_setup.prepare_workdir(workdir)
  with (contextlib.nullcontext(lease) if lease is not None
        else run_setup.leased(config, workdir)) as held:
    data_files.split_in_workdir(config.data, workdir, seed=config.seed)
    return _started(config, workdir, held)


def _check_data(config, workdir: str) -> None:
  """`data_files.check_data` of `config`'s data section and seed."""
  data_files.check_data(config.data, workdir, seed=config.seed)


def _started(config, workdir: str, lease) -> dict[str, Any]:
  with run_setup.start(config, workdir, lease=lease, check=_check_data,
                       choices=registry.config_choices()) as r:
    return _fine_tune(config, r)


def _fine_tune(config, r: run_setup.Run) -> dict[str, Any]:
  """`run`'s work, with the workdir checked and leased."""
  ##############################################################################
  # Task, starting model and data.
  ##############################################################################
  setup = _setup(config)

  ##############################################################################
  # Model and optimizer.
  ##############################################################################
  objective = TaskObjective(setup.spec.model, setup.task, setup.lm_weight)
  tx, schedule = optim.make(config.optimizer, config.num_train_steps,
                            setup.model_config)

  ##############################################################################
  # Train state: restored from the workdir, or created sharded with the
  # pre-trained encoder placed in.
  ##############################################################################
  start = r.restore_or_create(
      state_lib.state_init_fn(setup.spec.init_params, tx), tx,
      best_metric=setup.best_key, on_create=_encoder_placer(setup))
  r.record_config()
  record = functools.partial(
      predict_lib.record, r.workdir, setup.task, setup.model_config,
      setup.tokenizer, setup.seq_len, setup.lm_weight > 0)
  record()  # a checkpoint can be reloaded for prediction while training

  ##############################################################################
  # Data, steps and what users see.
  ##############################################################################
  train_batches = _train_batches(
      config, setup, r.data_sharding,
      sharding_lib.data_parallel_size(r.mesh) * config.accumulation_steps)
  rows = train_batches.batch_size  # config.batch_size, unless packed
  train = r.jit_train_step(objective, tx, schedule, start.shardings)
  replicated = jax.sharding.NamedSharding(r.mesh,
                                          jax.sharding.PartitionSpec())
  predict = sharding_lib.jit_in_mesh(
      lambda p, b: setup.task.predict(objective.outputs(p, b, None, True), b),
      r.mesh, r.rules,
      in_shardings=(start.shardings["params"], r.data_sharding),
      out_shardings=replicated, compiler_options=r.compiler_options)
  eval_batch = config.get("eval_batch_size") or config.batch_size

  ##############################################################################
  # Train loop, best checkpoint's predictions and final metrics.
  ##############################################################################
  out = r.fit(start, train, train_batches,
              evaluate=_evaluator(setup, predict, eval_batch,
                                  r.data_sharding),
              flops_per_step=setup.spec.flops_per_step(rows),
              rows_per_step=rows,
              tokens_per_sequence=setup.spec.tokens_per_row,
              best_key=setup.best_key)
  if out.preempted_at is not None:
    return run_setup.stopped_early(out)
  final_step, best_step, params = _best_params(r.workdir, out, start)
  best_eval, written = _best_predictions(
      setup, predict, params, eval_batch, r.data_sharding,
      os.fspath(storage.path(r.workdir) / "predictions"))
  record()  # again: evaluation tuned settings (SQuAD v2.0's threshold)
  result = {"task": setup.task.name, "data": data_name(config, setup.task),
            "step": final_step, "best_step": best_step,
            "skipped_steps": out.skipped_steps,
            **{f"eval_{k}": v for k, v in best_eval.items()},
            "predictions": written, "goodput": out.goodput,
            # With the goodput's wall time, the device-hours spent.
            "devices": jax.device_count()}
  r.write_final_metrics(result)
  return result


def _setup(config) -> _Setup:
  """The task, the starting model (`encoder_start`) and the training and
  eval splits, tokenised."""
  task = registry.make_task(config.data.task, config.data)
  start = start_lib.StartOptions.from_config(config)
  model_config, encoder, tokenizer = start_lib.encoder_start(start)
  lm_weight = start_lib.lm_aux_weight(start.lm_aux_weight, model_config,
                                      start.init)
  seq_len = config.data.max_seq_length
  # Before reading the data. A config written before `pack` existed ran
  # one example a row, and a resumed run keeps doing so (`defaults`).
  pack = spec_lib.pack_for(task, config.data.pack, lm_weight > 0,
                           model_config.causal)
  train_split = task.load(task.train_split, tokenizer, seq_len)
  eval_splits = [task.load(s, tokenizer, seq_len) for s in task.eval_splits]
  log.info("%s: %d training rows; eval %s.", task.name, train_split.num_rows,
           ", ".join(f"{s.name} {s.num_rows}" for s in eval_splits))
  return _Setup(task, model_config, encoder, tokenizer, lm_weight, seq_len,
                train_split, eval_splits,
                spec_lib.for_task(task, model_config, seq_len,
                                  lm_head=lm_weight > 0, pack=pack), pack)


def _encoder_placer(setup: _Setup):
  """`restore_or_create`'s on_create: (state, shardings) → the fresh state
  with the pre-trained encoder placed in (None: a random-init run)."""
  encoder = setup.encoder
  if encoder is None:
    return None
  required = ("lm",) if setup.lm_weight > 0 else ()
  return lambda st, sh: start_lib.place_encoder(st, sh, encoder,
                                                required=required)


def _evaluator(setup: _Setup, predict, eval_batch: int, data_sharding):
  """The loop's evaluate(state, step): every eval split's task metrics,
  named as `_Setup.metric_prefix` says."""
  def evaluate(st, step):
    del step
    out = {}
    for split in setup.eval_splits:
      preds = _predict_split(predict, st["params"], split, eval_batch,
                             data_sharding, setup.pack, setup.task.token_keys)
      metrics = setup.task.evaluate(preds, split)
      prefix = setup.metric_prefix(split.name)
      out.update({f"{prefix}{k}": float(v) for k, v in metrics.items()})
    return out
  return evaluate


def _train_batches(config, setup: _Setup, data_sharding, multiple: int):
  """The shuffled training batches of step s: `ArrayBatches`, or with
  `config.data.pack` `PackedBatches` (each epoch packed afresh; as many rows
  a step as hold `config.batch_size` examples on average, a multiple of
  `multiple`)."""
  features = setup.train_split.features
  if not setup.pack:
    return batching.ArrayBatches(
        features, config.batch_size, sharding=data_sharding, seed=config.seed)
  batches = batching.PackedBatches(
      features, setup.pack, config.batch_size, sharding=data_sharding,
      seed=config.seed, multiple=multiple, token_keys=setup.task.token_keys)
  examples, rows = batches.num_examples, batches.rows_per_epoch
  log.info("Packed %d training examples into %d rows of up to %d (%.2f a "
           "row): padding %.1f%% of positions (%.1f%% one per row). A step "
           "takes %d rows, about %.1f examples (batch_size %d); each epoch "
           "is packed afresh from its shuffle.", examples, rows, setup.pack,
           examples / rows, 100 * batches.padding_fraction(),
           100 * packing.padding_fraction(features), batches.batch_size,
           batches.batch_size * examples / rows, config.batch_size)
  return batches


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
                           setup.pack, task.token_keys)
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
