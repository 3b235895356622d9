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
import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import sharding as sharding_lib
from albert_jax import storage
from albert_jax import tree as tree_lib
from albert_jax.finetune import batching
from albert_jax.finetune import predict as predict_lib
from albert_jax.finetune import registry
from albert_jax.finetune.task import FineTuneModel
from albert_jax.finetune.task import Split
from albert_jax.finetune.task import Task
from albert_jax.finetune.task import TaskObjective
from albert_jax.model import flops as flops_lib
from albert_jax.model.config import ModelConfig
from albert_jax.text import run_tokenizer
from albert_jax.training import checkpoints
from albert_jax.training import lease as lease_lib
from albert_jax.training import loop
from albert_jax.training import optimizer as optim
from albert_jax.training import recipe
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

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


def check_tokenizer(tokenizer, own, model_config: ModelConfig, path: str,
                    init: str) -> None:
  """Refuses a configured tokenizer whose ids would mean other words to the
  checkpoint: more pieces than its embedding table has rows (the ids past
  the end gave NaN losses), or, where the checkpoint has its own tokenizer,
  other pieces for the same ids (it fine-tuned silently on the wrong
  words)."""
  if tokenizer.vocab_size > model_config.vocab_size:
    raise ValueError(
        f"config.data.tokenizer {path} has {tokenizer.vocab_size} pieces but "
        f"the checkpoint {init} embeds {model_config.vocab_size}; use the "
        "tokenizer it was pre-trained with (leave config.data.tokenizer "
        "empty where the checkpoint has one).")
  if own is None:
    return
  differs = next((i for i in range(min(tokenizer.vocab_size, own.vocab_size))
                  if tokenizer.id_to_piece(i) != own.id_to_piece(i)), None)
  if differs is not None or tokenizer.vocab_size != own.vocab_size:
    where = (f"id {differs} is {tokenizer.id_to_piece(differs)!r} there and "
             f"{own.id_to_piece(differs)!r} in the checkpoint's"
             if differs is not None else
             f"{tokenizer.vocab_size} pieces against {own.vocab_size}")
    raise ValueError(
        f"config.data.tokenizer {path} is not the tokenizer {init} was "
        f"pre-trained with ({where}); leave config.data.tokenizer empty to "
        "use the checkpoint's own.")


def encoder_start(config) -> tuple[ModelConfig, Any, Any]:
  """(model config, pre-trained encoder params or None, tokenizer).

  The encoder params are the checkpoint's embeddings, encoder and pooler,
  plus its "lm" head where `config.lm_aux_weight` > 0 (and it has one).
  """
  overrides = {k: v for k, v in config.model.items() if v is not None}
  lm_aux = lm_aux_weight(config) > 0
  if config.init:
    from albert_jax.interop.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
    pre = load_pretrained(config.init, **overrides)
    lm_aux_weight(config, pre.model_config)
    if pre.tokenizer is None and not config.data.get("tokenizer"):
      raise ValueError(
          f"{config.init} has no tokenizer; set config.data.tokenizer to its "
          "SentencePiece .model, vocab.txt or tokenizer.json.")
    tokenizer = pre.tokenizer
    if config.data.get("tokenizer"):
      tokenizer = run_tokenizer.load(config.data.tokenizer,
                                     "config.data.tokenizer",
                                     run_tokenizer.CONFIGURED_FIX)
      check_tokenizer(tokenizer, pre.tokenizer, pre.model_config,
                      config.data.tokenizer, config.init)
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
  log.warning("config.init is empty: fine-tuning from random weights.")
  model_config = ModelConfig.from_dict(overrides)
  lm_aux_weight(config, model_config)
  return model_config, None, run_tokenizer.load(
      config.data.tokenizer, "config.data.tokenizer",
      run_tokenizer.CONFIGURED_FIX)


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
        f"parameters ({', '.join(tree_lib.flatten(target[absent[0]]))}). "
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
  optim.check(config)
  workdir = storage.as_str(workdir)
  check_data(config, workdir)
  recipe.check(config, workdir)
  loop.prepare_workdir(workdir)
  if lease is not None:
    return _run(config, workdir, lease)
  with lease_lib.acquire(workdir,
                         config.get("take_over_workdir", False)) as lease:
    return _run(config, workdir, lease)


def _run(config, workdir: str, lease: lease_lib.Lease) -> dict[str, Any]:
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
             lease=lease)
  if out.preempted_at is not None:
    return {"preempted_at": out.preempted_at, "stopped_by": out.stopped_by}
  final_step, best_step, params = _best_params(workdir, out, start)
  best_eval, written = _best_predictions(
      setup, predict, params, eval_batch, data_sharding,
      os.fspath(storage.path(workdir) / "predictions"))
  record()  # again: evaluation tuned settings (SQuAD v2.0's threshold)
  result = {"task": setup.task.name, "data": data_name(config, setup.task),
            "step": final_step, "best_step": best_step,
            "skipped_steps": out.skipped_steps,
            **{f"eval_{k}": v for k, v in best_eval.items()},
            "predictions": written}
  if jax.process_index() == 0:
    storage.write_atomic(storage.path(workdir) / "final_metrics.json",
                         json.dumps(result, indent=2))
  return result


def _setup(config) -> _Setup:
  """The task, the starting model (`encoder_start`) and the training and
  eval splits, tokenised."""
  task = registry.make_task(config.data.task, config.data)
  model_config, encoder, tokenizer = encoder_start(config)
  lm_weight = lm_aux_weight(config, model_config)
  seq_len = config.data.max_seq_length
  train_split = task.load(task.train_split, tokenizer, seq_len)
  eval_splits = [task.load(s, tokenizer, seq_len) for s in task.eval_splits]
  log.info("%s: %d training rows; eval %s.", task.name, train_split.num_rows,
           ", ".join(f"{s.name} {s.num_rows}" for s in eval_splits))
  return _Setup(task, model_config, encoder, tokenizer, lm_weight, seq_len,
                train_split, eval_splits)


def _start_state(config, workdir: str, setup: _Setup, mesh, rules):
  """(objective, tx, schedule, `loop.StartState`): the model with the task's
  head, its optimizer and the train state, restored from the workdir's
  newest checkpoint, else fresh with the pre-trained encoder placed in."""
  model = FineTuneModel(setup.model_config,
                        setup.task.head(setup.model_config),
                        lm_head=setup.lm_weight > 0)
  objective = TaskObjective(model, setup.task, setup.lm_weight)
  tx, schedule = optim.make(config)
  example = {k: v[:1] for k, v in setup.train_split.features.items()}
  example["weights"] = np.ones(1, np.float32)
  init = state_lib.state_init_fn(
      lambda r: model.init(r, example, deterministic=True)["params"], tx)
  encoder = setup.encoder
  required = ("lm",) if setup.lm_weight > 0 else ()
  start = loop.restore_or_create(
      config, workdir, init, tx, mesh, rules, best_metric=setup.best_key,
      on_create=None if encoder is None else (
          lambda st, sh: _place_encoder(st, sh, encoder, required=required)))
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
                             data_sharding)
      metrics = setup.task.evaluate(preds, split)
      prefix = setup.metric_prefix(split.name)
      out.update({f"{prefix}{k}": float(v) for k, v in metrics.items()})
    return out
  return evaluate


def _fit(config, workdir: str, setup: _Setup, start, train, *, evaluate,
         lease, data_sharding) -> loop.FitResult:
  """The training loop (`loop.fit`) from `start` to
  `config.num_train_steps`, over shuffled training batches."""
  start_step = start.step
  train_batches = batching.ArrayBatches(
      setup.train_split.features, config.batch_size, sharding=data_sharding,
      seed=config.seed)
  seq_shape = setup.train_split.features["input_ids"].shape[1:]
  flops_per_step = flops_lib.training_flops_per_step(
      setup.model_config, config.batch_size * int(np.prod(seq_shape[:-1])),
      seq_shape[-1], 0, heads=("lm",) if setup.lm_weight > 0 else ())
  return loop.fit(
      config, state=start.state, train_step=train, mngr=start.mngr,
      workdir=workdir, batches=train_batches.iterate(
          start_step, max(config.num_train_steps - start_step, 0)),
      start_step=start_step, resumed=start.resumed, evaluate=evaluate,
      flops_per_step=flops_per_step, tokens_per_sequence=int(
          np.prod(seq_shape)),
      param_paths=list(tree_lib.flatten(start.state["params"])),
      best_key=setup.best_key, lease=lease)


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
    preds = _predict_split(predict, params, split, eval_batch, data_sharding)
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


RANDOM_INIT = "<random>"  # _from_random's marker: keep init empty.
RANDOM_INIT_DIR = "finetune_random_init"


def run_after_pretraining(config, pretrain_workdir: str,
                          random_init: bool = False) -> dict[str, Any]:
  """Fine-tunes the model a pre-training run just wrote (`config.finetune`
  of a pre-training config), in `pretrain_workdir/finetune`.

  With `random_init`, the same fine-tune (same model shape, tokenizer,
  data split, steps and seed) starts from random weights instead, in
  `pretrain_workdir/finetune_random_init`: the baseline that shows what
  pre-training bought (`config.compare_random_init` in the demo).

  `config.init` defaults to the pre-training workdir. With
  `config.data.split_from` (a labelled TSV/CSV/JSONL file; "bundled/..."
  names one shipped in albert_jax/data/bundled), the file is cut into
  stratified train/eval/test files (`config.data.split_fractions`, seed
  `config.seed`) for the "files" task.

  With `config.predict_texts` (texts the data does not hold), the best
  checkpoint is reloaded as a user would (`albert_jax.load_pretrained`)
  and predicts them: the result's "new_predictions" lists {"text", "label",
  "probability"} (or {"text", "score"} for regression) per text.
  """
  config = config.copy_and_resolve_references()
  optim.check(config)
  workdir = os.fspath(storage.path(storage.as_str(pretrain_workdir))
                      / (RANDOM_INIT_DIR if random_init else "finetune"))
  check_data(config, workdir)  # before the split rewrites WORKDIR/data
  loop.prepare_workdir(workdir)
  # Leased before the split files are written: a second launch must not
  # rewrite the files a running fine-tune reads.
  with lease_lib.acquire(workdir,
                         config.get("take_over_workdir", False)) as lease:
    if random_init:
      config = _from_random(config, pretrain_workdir)
    result = run(_with_split_data(config, workdir, pretrain_workdir),
                 workdir, lease=lease)
  texts = [] if random_init else list(config.get("predict_texts") or ())
  if texts and "preempted_at" not in result:
    result["new_predictions"] = predict_new(workdir, texts)
  return result


def predict_new(workdir: str, texts: list[str]) -> list[dict[str, Any]]:
  """The best checkpoint of fine-tuning `workdir`, reloaded, on `texts`:
  {"text", "label", "probability"} (classification) or {"text", "score"}
  per text, also logged."""
  model = predict_lib.load(workdir, "best")
  out = []
  for text, pred in zip(texts, model.predict(texts)):
    kept = {k: pred[k] for k in ("label", "probability", "score")
            if k in pred}
    out.append({"text": text, **kept})
    log.info("Prediction of step %s on a new text: %s — %r", model.step,
             ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else
                       f"{k} {v}" for k, v in kept.items()), text)
  return out


def _from_random(config, pretrain_workdir: str):
  """`config` fine-tuning the pre-trained run's model shape and tokenizer
  from random weights: no init, the run's full model section and its
  tokenizer file."""
  from albert_jax.interop import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  recorded = workdir_lib.read_workdir_config(pretrain_workdir)
  tokenizer = run_tokenizer.find(recorded, pretrain_workdir)
  if tokenizer is None:
    raise ValueError(f"{pretrain_workdir} has no tokenizer to fine-tune a "
                     "random-init baseline with.")
  with config.unlocked():
    config.init = RANDOM_INIT
    config.data.tokenizer = tokenizer.path
    for key, value in recorded["model"].items():
      if config.model.get(key) is None:
        config.model[key] = value
  return config


def _with_split_data(config, workdir: str, pretrain_workdir: str):
  """`config` with `init` defaulting to the pre-training workdir and, with
  `data.split_from`, the file cut into WORKDIR/data/{train,eval,test}."""
  with config.unlocked():
    if config.init == RANDOM_INIT:
      config.init = ""
    elif not config.init:
      config.init = pretrain_workdir
    if config.data.get("split_from"):
      out_dir = os.fspath(storage.path(workdir) / "data")
      parts = _split_files(config, out_dir, write=jax.process_index() == 0)
      if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
        multihost_utils.sync_global_devices("finetune data split")
      if parts is not None:
        log.info("Split %s into %s.", config.data.split_from, ", ".join(
            f"{k} {v['rows']} rows {v['labels']}" for k, v in parts.items()))
  return config


def _split_files(config, out_dir: str, write: bool) -> dict | None:
  """Points `config.data`'s train/eval/test files at
  `out_dir/{train,eval,test}.<ext>`, the stratified split of
  `data.split_from` (`tabular.split_file`), which `write` writes there.

  Returns:
    split → {"path", "rows", "labels"} where written, else None.
  """
  from albert_jax.finetune import tabular  # pylint: disable=g-import-not-at-top
  source = config.data.split_from
  if source.startswith("bundled/"):
    # A file shipped inside the package, not a user path.
    source = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                          "data", source)
  parts = tabular.split_file(
      source, out_dir, tuple(config.data.split_fractions), seed=config.seed,
      label_column=config.data.label_column) if write else None
  suffix = tabular.file_format(source) + (
      ".gz" if source.endswith(".gz") else "")
  with config.unlocked():
    for name in ("train", "eval", "test"):
      config.data[f"{name}_file"] = os.fspath(
          storage.path(out_dir) / (name + suffix))
  return parts


# The data files a fine-tuning run reads, which its recipe fingerprints.
DATA_FILES = ("data.train_file", "data.eval_file", "data.test_file")


def check_data(config, workdir: str) -> None:
  """Refuses to rerun a fine-tuning workdir on other data than its run's.

  A run's checkpoints, predictions and final_metrics.json belong to the data
  it read: rerun on other files, a finished run used to re-evaluate, report
  "Fine-tuned on <new file>" and rewrite final_metrics.json. The files'
  fingerprints in the workdir's recipe (`recipe.RECIPE`) are compared with
  those of the files `config` names; with `data.split_from` not yet split,
  with those of its split, cut into a temporary directory on this machine,
  so nothing in the workdir is written (and every process decides alike).

  Raises:
    recipe.RecipeError: one line naming the workdir, the data it was
      trained on (its config.json) and the fix.
  """
  path = storage.path(workdir) / recipe.RECIPE
  if not path.is_file():
    return  # a new run
  was = json.loads(path.read_text(encoding="utf-8")).get("files", {})
  if not any(k in was for k in DATA_FILES):
    return  # a TFDS task: no data files
  data = config.data
  if data.get("split_from") and not data.get("train_file"):
    import tempfile  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      split = config.copy_and_resolve_references()
      _split_files(split, tmp, write=True)
      now = recipe.recipe(split, workdir)["files"]
  else:
    now = recipe.recipe(config, workdir)["files"]
  if all(was.get(k) == now.get(k) for k in DATA_FILES):
    return
  recorded = _recorded_data(workdir)
  if data.get("split_from") and not data.get("train_file"):
    given = f"data.split_from={data.split_from}"
  else:
    changed = []
    for key in DATA_FILES:
      if was.get(key) != now.get(key):
        value = data.get(key[len("data."):]) or "none"
        same = value == recorded.get(key)
        changed.append(f"{key}={value}"
                       + (" (its content changed)" if same else ""))
    given = ", ".join(changed)
  if recorded.get("data.split_from"):
    trained = f"data.split_from={recorded['data.split_from']}"
  else:
    trained = ", ".join(f"{k}={recorded[k]}" for k in DATA_FILES
                        if recorded.get(k)) or f"the files {path} records"
  raise recipe.RecipeError(
      f"{workdir} was fine-tuned on {trained}, and this run gives other "
      f"data ({given}); its checkpoints, predictions and final_metrics.json "
      "belong to the data it was trained on. Fine-tune on the new data in a "
      "new workdir (another --workdir), or rerun with the original files.")


def _recorded_data(workdir: str) -> dict[str, str]:
  """The data files a workdir's config.json (`loop.record_config`) names,
  by dotted key ({} where it cannot be read)."""
  try:
    data = json.loads((storage.path(workdir) / "config.json").read_text(
        encoding="utf-8")).get("data", {})
  except (OSError, ValueError, AttributeError):
    return {}
  return {f"data.{k}": v for k, v in data.items()
          if k in ("split_from", "train_file", "eval_file", "test_file")
          and isinstance(v, str) and v}
