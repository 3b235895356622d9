"""Fine-tuning: one `run(config, workdir)` for every task.

The task (`config.data.task`) supplies data, head, loss, metrics and
prediction files; the model starts from `config.init` (anything
`load_pretrained` takes: an albert_jax workdir, an HF directory, an official
TF release) with `config.model`'s non-empty fields as overrides (dropout,
dtype, attention kernel). Everything else is the pre-training machinery: the
same mesh and sharding rules, optimizer, train step (with the task as its
objective), loop, checkpoints and metrics. At the end the best checkpoint by
the task's metric writes the prediction files into `workdir/predictions`.

`config.lm_aux_weight` λ > 0 fine-tunes a causal (GPT) model as GPT-1 did
(Radford et al. 2018, sec. 3.2; λ = 0.5 there): the task loss plus λ × the
next-token loss on the task rows' own input text, through the pre-trained
"lm" head tied to the word embeddings.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import checkpoints
from albert_jax import flops as flops_lib
from albert_jax import loop
from albert_jax import optim
from albert_jax import sharding as sharding_lib
from albert_jax import train_step as step_lib
from albert_jax.finetune import batching
from albert_jax.finetune import tasks
from albert_jax.finetune.task import FineTuneModel
from albert_jax.finetune.task import Task
from albert_jax.finetune.task import TaskObjective
from albert_jax.model_config import ModelConfig

log = logging.getLogger(__name__)


def lm_aux_weight(config, model_config: ModelConfig | None = None) -> float:
  """`config.lm_aux_weight` (0 where the config has none), checked.

  Raises:
    ValueError: not a finite number >= 0, or, given `model_config`, > 0 on
      a bidirectional model.
  """
  weight = config.get("lm_aux_weight", 0.0)
  if (isinstance(weight, bool) or not isinstance(weight, (int, float))
      or not math.isfinite(weight) or weight < 0):
    raise ValueError(
        f"config.lm_aux_weight must be a number >= 0 (0 turns GPT-1's "
        f"auxiliary language-modelling loss off; GPT-1 used 0.5), got "
        f"{weight!r}.")
  if weight > 0 and model_config is not None and not model_config.causal:
    raise ValueError(
        f"config.lm_aux_weight={weight} adds GPT-1's next-token loss, which "
        f"needs a causal (GPT) model, and {config.init or 'config.model'} "
        "is bidirectional (model.causal=False): each token sees the one it "
        "would predict. Fine-tune a causal model (the workdir of a "
        "config.pretraining='causal_lm' run, e.g. configs/gpt_small.py) or "
        "set --config.lm_aux_weight=0.")
  return float(weight)


def encoder_start(config) -> tuple[ModelConfig, Any, Any]:
  """(model config, pre-trained encoder params or None, tokenizer).

  The encoder params are the checkpoint's embeddings, encoder and pooler,
  plus its "lm" head where `config.lm_aux_weight` > 0 (and it has one).
  """
  overrides = {k: v for k, v in config.model.items() if v is not None}
  lm_aux = lm_aux_weight(config) > 0
  if config.init:
    from albert_jax.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
    pre = load_pretrained(config.init, **overrides)
    lm_aux_weight(config, pre.model_config)
    if pre.tokenizer is None and not config.data.get("tokenizer"):
      raise ValueError(
          f"{config.init} has no tokenizer; set config.data.tokenizer to its "
          "SentencePiece .model, vocab.txt or tokenizer.json.")
    tokenizer = pre.tokenizer
    if config.data.get("tokenizer"):
      from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
      tokenizer = Tokenizer.from_file(config.data.tokenizer)
    parts = ("embeddings", "encoder", "pooler") + (("lm",) if lm_aux else ())
    encoder = {k: pre.params[k] for k in parts if k in pre.params}
    if "pooler" not in encoder:
      log.warning("%s has no pooler weights; the pooler starts from random "
                  "values.", config.init)
    return pre.model_config, encoder, tokenizer
  if not config.data.get("tokenizer"):
    raise ValueError(
        "Set config.init to a pre-trained checkpoint (albert_jax workdir, HF "
        "directory or official ALBERT release) or, to fine-tune from random "
        "weights, config.data.tokenizer plus the full config.model.")
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  log.warning("config.init is empty: fine-tuning from random weights.")
  model_config = ModelConfig.from_dict(overrides)
  lm_aux_weight(config, model_config)
  return model_config, None, Tokenizer.from_file(config.data.tokenizer)


def _place_encoder(state, shardings, encoder, required=()) -> dict:
  """Puts the pre-trained arrays into `params["albert"]`, checking shapes.

  `required`: parts of `params["albert"]` that must come from `encoder`
  wherever the model has parameters for them (the "lm" head of
  `lm_aux_weight`, which must never start from random values).
  """
  target = state["params"]["albert"]
  absent = [k for k in required if k in target and k not in encoder]
  if absent:
    raise ValueError(
        f"config.lm_aux_weight > 0 decodes through the pre-trained "
        f"next-token head, and the checkpoint has no {absent[0]!r} "
        f"parameters ({', '.join(step_lib.leaf_paths(target[absent[0]]))}). "
        "Start from the workdir of a config.pretraining='causal_lm' run, "
        "which saves them, or set --config.lm_aux_weight=0.")
  flat_new = dict(jax.tree_util.tree_flatten_with_path(encoder)[0])
  problems = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
    top = getattr(path[0], "key", None)
    if top not in encoder:
      continue
    if path not in flat_new:
      problems.append(f"{jax.tree_util.keystr(path)}: missing")
    elif tuple(np.shape(flat_new[path])) != tuple(leaf.shape):
      problems.append(f"{jax.tree_util.keystr(path)}: checkpoint "
                      f"{tuple(np.shape(flat_new[path]))}, model "
                      f"{tuple(leaf.shape)}")
  if problems:
    raise ValueError("The pre-trained weights do not fit the model: "
                     + "; ".join(problems[:10]))
  def put(path, leaf, sharding):
    top = getattr(path[0], "key", None)
    if top not in encoder:
      return leaf
    return jax.device_put(jnp.asarray(flat_new[path], leaf.dtype), sharding)
  albert = jax.tree_util.tree_map_with_path(
      put, target, shardings["params"]["albert"])
  return {**state, "params": {**state["params"], "albert": albert}}


def _predict_split(predict, params, split, batch_size, data_sharding):
  """Predictions for all of a split's rows, padding dropped."""
  batches = batching.ArrayBatches(split.features, batch_size,
                                  sharding=data_sharding)
  parts = [jax.device_get(predict(params, b))
           for b in batches.eval_batches()]
  return {k: np.concatenate([p[k] for p in parts])[:split.num_rows]
          for k in parts[0]}


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
  return os.path.basename(source) if source else task.name


def run(config, workdir: str) -> dict[str, Any]:
  """Fine-tunes per `config` in `workdir`; returns the final metrics."""
  ##############################################################################
  # Task, encoder and data.
  ##############################################################################
  loop.prepare_workdir(workdir)
  mesh, rules = loop.mesh_and_rules(config)
  task = tasks.make_task(config.data.task, config.data)
  model_config, encoder, tokenizer = encoder_start(config)
  lm_weight = lm_aux_weight(config, model_config)
  seq_len = config.data.max_seq_length
  train_split = task.load(task.train_split, tokenizer, seq_len)
  eval_splits = [task.load(s, tokenizer, seq_len) for s in task.eval_splits]
  log.info("%s: %d training rows; eval %s.", task.name, train_split.num_rows,
           ", ".join(f"{s.name} {s.num_rows}" for s in eval_splits))

  ##############################################################################
  # Mesh, model, optimizer and state (restored, or pre-trained + new head).
  ##############################################################################
  model = FineTuneModel(model_config, task.head(model_config),
                        lm_head=lm_weight > 0)
  objective = TaskObjective(model, task, lm_weight)
  tx, schedule = optim.make(config)
  example = {k: v[:1] for k, v in train_split.features.items()}
  example["weights"] = np.ones(1, np.float32)
  init = step_lib.state_init_fn(
      lambda r: model.init(r, example, deterministic=True)["params"], tx)
  best_key = (task.metric if len(eval_splits) == 1
              else f"{eval_splits[0].name}/{task.metric}")
  start = loop.restore_or_create(
      config, workdir, init, tx, mesh, rules, best_metric=best_key,
      on_create=None if encoder is None else (
          lambda st, sh: _place_encoder(
              st, sh, encoder, required=("lm",) if lm_weight > 0 else ())))
  state, shardings, mngr = start.state, start.shardings, start.mngr
  abstract = start.abstract
  start_step = start.step
  loop.record_config(config, workdir)

  ##############################################################################
  # Steps, evaluation and the loop.
  ##############################################################################
  data_sharding = sharding_lib.data_sharding(mesh)
  train_batches = batching.ArrayBatches(
      train_split.features, config.batch_size, sharding=data_sharding,
      seed=config.seed)
  train = step_lib.jit_train_step(
      step_lib.make_train_step(objective, tx, schedule,
                               config.accumulation_steps),
      shardings, mesh, rules, loop.compiler_options(config))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  predict_jit = jax.jit(
      lambda p, b: task.predict(objective.outputs(p, b, None, True), b),
      in_shardings=(shardings["params"], data_sharding),
      out_shardings=replicated,
      compiler_options=loop.compiler_options(config))

  def predict(params, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return predict_jit(params, batch)

  eval_batch = config.get("eval_batch_size") or config.batch_size

  def evaluate(st, step):
    del step
    out = {}
    for split in eval_splits:
      preds = _predict_split(predict, st["params"], split, eval_batch,
                             data_sharding)
      metrics = task.evaluate(preds, split)
      prefix = "" if len(eval_splits) == 1 else f"{split.name}/"
      out.update({f"{prefix}{k}": float(v) for k, v in metrics.items()})
    return out

  seq_shape = train_split.features["input_ids"].shape[1:]
  flops_per_step = flops_lib.training_flops_per_step(
      model_config, config.batch_size * int(np.prod(seq_shape[:-1])),
      seq_shape[-1], 0, heads=("lm",) if lm_weight > 0 else ())
  out = loop.fit(
      config, state=state, train_step=train, mngr=mngr, workdir=workdir,
      batches=train_batches.iterate(
          start_step, max(config.num_train_steps - start_step, 0)),
      start_step=start_step, resumed=start.resumed, evaluate=evaluate,
      flops_per_step=flops_per_step, tokens_per_sequence=int(
          np.prod(seq_shape)),
      param_paths=step_lib.leaf_paths(state["params"]), best_key=best_key)
  if out.preempted_at is not None:
    return {"preempted_at": out.preempted_at}

  ##############################################################################
  # The best checkpoint's predictions and the summary.
  ##############################################################################
  final_step = int(jax.device_get(out.state["step"]))
  best_step = mngr.best_step() or final_step
  params = out.state["params"]
  if best_step != final_step:
    params, _ = checkpoints.restore_params(
        workdir, abstract["params"], step=best_step,
        sharding=None)
    params = jax.device_put(params, shardings["params"])
  pred_dir = os.path.join(workdir, "predictions")
  written = []
  best_eval = {}
  if jax.process_index() == 0:
    os.makedirs(pred_dir, exist_ok=True)
  names = list(task.eval_splits) + [s for s in task.predict_splits
                                    if s not in task.eval_splits]
  majority = _majority_label(train_split)
  for name in names:
    split = next((s for s in eval_splits if s.name == name), None) or (
        task.load(name, tokenizer, seq_len))
    preds = _predict_split(predict, params, split, eval_batch, data_sharding)
    if split.has_labels:
      prefix = ("" if len(eval_splits) == 1 and name == eval_splits[0].name
                else f"{name}/")
      best_eval.update({f"{prefix}{k}": float(v)
                        for k, v in task.evaluate(preds, split).items()})
      if majority is not None:
        best_eval[f"{prefix}majority_baseline_accuracy"] = float(np.mean(
            split.features["labels"] == majority))
    if jax.process_index() == 0:
      written += task.write_predictions(preds, split, pred_dir)
  result = {"task": task.name, "data": data_name(config, task),
            "step": final_step, "best_step": best_step,
            "skipped_steps": out.skipped_steps,
            **{f"eval_{k}": v for k, v in best_eval.items()},
            "predictions": written}
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "final_metrics.json"), "w",
              encoding="utf-8") as f:
      json.dump(result, f, indent=2)
  return result


def run_after_pretraining(config, pretrain_workdir: str) -> dict[str, Any]:
  """Fine-tunes the model a pre-training run just wrote (`config.finetune`
  of a pre-training config), in `pretrain_workdir/finetune`.

  `config.init` defaults to the pre-training workdir. With
  `config.data.split_from` (a labelled TSV/CSV/JSONL file; "bundled/..."
  names one shipped in albert_jax/data/bundled), the file is cut into
  stratified train/eval/test files (`config.data.split_fractions`, seed
  `config.seed`) for the "files" task.
  """
  config = config.copy_and_resolve_references()
  workdir = os.path.join(pretrain_workdir, "finetune")
  loop.prepare_workdir(workdir)
  with config.unlocked():
    if not config.init:
      config.init = pretrain_workdir
    source = config.data.get("split_from")
    if source:
      from albert_jax.finetune import tables  # pylint: disable=g-import-not-at-top
      if source.startswith("bundled/"):
        source = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                              "data", source)
      out_dir = os.path.join(workdir, "data")
      if jax.process_index() == 0:
        parts = tables.split_file(
            source, out_dir, tuple(config.data.split_fractions),
            seed=config.seed, label_column=config.data.label_column)
      if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
        multihost_utils.sync_global_devices("finetune data split")
      suffix = tables.file_format(source) + (
          ".gz" if source.endswith(".gz") else "")
      for name in ("train", "eval", "test"):
        config.data[f"{name}_file"] = os.path.join(out_dir, name + suffix)
      if jax.process_index() == 0:
        log.info("Split %s into %s.", source, ", ".join(
            f"{k} {v['rows']} rows {v['labels']}" for k, v in parts.items()))
  return run(config, workdir)
