"""A fine-tuned model, reloaded: predictions on new text, and files of them.

A fine-tuning run (`albert_jax.finetune.run`) records in its workdir what
prediction needs beside the checkpoints: `task.json` (the task's type,
label names, head and featurization settings and the resolved model
config) and `tokenizer/` (the vocabulary it was featurized with). `load`
reads them and one checkpoint's parameters (the newest, the best by the
task's metric, or step N) into a `FineTuned`, whose `predict` takes raw
text:

  classification, regression: a text or a (text, text) pair →
    {"label", "probability", "probabilities", "logits"} or {"score"}.
  multiple_choice: (context, endings) or (context, question, endings) →
    {"choice", "answer", "probabilities", "logits"}.
  question_answering: (question, context) → {"answer", "start", "end",
    "probability", "score"} (characters [start, end) of the context), and
    for v2.0-style heads "null_odds" and "no_answer".
  token_classification: a text → {"entities": [{"text", "label", "start",
    "end"}], "words", "tags"}.

Inputs are featurized exactly as the task featurized its data, padded to
its `max_seq_length`, packed several to a row where the task type packs
(`FineTuned.pack`: each input's outputs are its outputs alone, within
float rounding) and run in fixed-size batches, so a model's predictions on
its own eval rows are the run's eval predictions. What
differs by task type (its task.json fields, head, inputs and predictions)
is the type's own (`albert_jax.finetune.task_type`), reached through
`registry.task_type`.
With several devices, prediction is sharded as training was: the mesh and
logical axis rules the run recorded (its config.json's `mesh` and
`sharding_rules`; the defaults of `albert_jax.sharding` otherwise), the
parameters placed by their logical axes and every batch split over the
data axes, padded to a multiple of their size.
`albert_jax.finetune.serving.prediction_files` streams a TSV/CSV/JSONL(.gz) file into
a JSONL file of predictions and is the command line
(`python -m albert_jax.predict`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from albert_jax import sharding as sharding_lib
from albert_jax import storage
from albert_jax.finetune import batching
from albert_jax.finetune import packing
from albert_jax.finetune import registry
from albert_jax.finetune import spec as spec_lib
from albert_jax.finetune.task import INPUT_KEYS
from albert_jax.finetune.task_type import PredictError
from albert_jax.interop.workdir import TASK_FILE
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig

log = logging.getLogger(__name__)

TOKENIZER_DIR = "tokenizer"
RUN_CONFIG_FILE = "config.json"  # the run's config (`run_setup.record_config`)


################################################################################
# Recording (the fine-tuning run) and loading.
################################################################################


def record(workdir: str, task, model_config: ModelConfig, tokenizer,
           max_seq_length: int, lm_head: bool) -> None:
  """Writes `task.json` and `tokenizer/` into a fine-tuning workdir (process
  0; nothing for a task whose `describe` is None)."""
  info = task.describe()
  if info is None or jax.process_index() != 0:
    return
  root = storage.path(workdir)
  if not (root / TOKENIZER_DIR).exists():
    tokenizer.save(root / TOKENIZER_DIR)
  storage.write_atomic(root / TASK_FILE, json.dumps(
      {"task": task.name, **info, "max_seq_length": int(max_seq_length),
       "lm_head": bool(lm_head), "model": model_config.to_dict()},
      indent=2))


def task_info_problem(info: dict, cfg: ModelConfig) -> str | None:
  """What is wrong with a `task.json`'s fields (types, and sizes against
  the model), or None: checked before its sizes shape anything, so a
  damaged or crafted file never allocates (a max_seq_length of 10**12 asked
  numpy for terabytes). The task type checks its own fields."""
  kind = info.get("task_type")
  kinds = registry.task_types()
  if not isinstance(kind, str) or kind not in kinds:
    return f"task_type {kind!r} is not one of {tuple(kinds)}"
  if not isinstance(info.get("task"), str):
    return f"task {info.get('task')!r} is not a task name"
  t = info.get("max_seq_length")
  if not (isinstance(t, int) and not isinstance(t, bool)
          and 1 <= t <= cfg.max_position_embeddings):
    return (f"max_seq_length {t!r} is not a whole number in [1, "
            f"{cfg.max_position_embeddings}], the model's positions")
  if not isinstance(info.get("lm_head", False), bool):
    return f"lm_head {info.get('lm_head')!r} is not true or false"
  return registry.task_type(kind).task_info_problem(info)


def spec_from_record(info: dict, cfg: ModelConfig) -> spec_lib.FineTuneSpec:
  """The fine-tuned model `info` (a `task.json`) describes, on encoder
  `cfg`: its task type's head and the model inputs of one row.

  Raises:
    PredictError: a task_type this version does not know.
  """
  kind = registry.task_type(info["task_type"])
  return spec_lib.FineTuneSpec(cfg, kind.head(info, cfg),
                               bool(info.get("lm_head", False)),
                               kind.features(info["max_seq_length"]))


def best_step(path: str) -> int:
  """The best checkpoint's step of a fine-tuning workdir, as its run chose
  it (`final_metrics.json`'s "best_step").

  Raises:
    FileNotFoundError: the run has not finished (no final_metrics.json).
  """
  metrics = storage.path(path) / "final_metrics.json"
  if not metrics.is_file():
    raise FileNotFoundError(
        f"{path} has no final_metrics.json yet, which names the best "
        "checkpoint once the run finishes; load step=None (the newest) or "
        "step=N.")
  fix = ("rerun the fine-tuning command on this workdir to write it again, "
         "or load step=None (the newest) or step=N.")
  best = storage.read_json_object(metrics, fix).get("best_step")
  if isinstance(best, bool) or not isinstance(best, int) or best < 0:
    raise storage.DamagedFileError(
        f"{metrics} is damaged (its best_step is {best!r}, not a step "
        f"number); {fix}")
  return best


def load(path: str, step: int | str | None = None, *,
         pack: int | None = None, **overrides) -> FineTuned:
  """A fine-tuning workdir's model, head and tokenizer.

  Args:
    path: the workdir, local or gs://.
    step: None (the newest checkpoint), "best" (the run's best by its
      metric) or a step number.
    pack: inputs a row holds (`FineTuned.pack`; None: packed where the
      task type packs).
    **overrides: ModelConfig fields to change (dtype="bfloat16",
      attention_impl="xla"); shape-defining ones must match the weights.

  Raises:
    CheckpointError: no task.json, tokenizer or checkpoint, or weights that
      do not fit.
  """
  from albert_jax.interop import CheckpointError  # pylint: disable=g-import-not-at-top
  from albert_jax.text import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.text.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  from albert_jax.training import checkpoint_shapes  # pylint: disable=g-import-not-at-top
  from albert_jax.training import checkpoints  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  root = storage.path(path)
  fix = ("a fine-tuning run writes it when it starts: rerun the fine-tuning "
         "command on this workdir, or restore the file.")
  try:
    info = storage.read_json_object(root / TASK_FILE, fix)
  except (OSError, storage.DamagedFileError) as e:
    raise CheckpointError(f"{path}/{TASK_FILE} cannot be read ({e}); "
                          f"{fix}") from e
  if not isinstance(info.get("model"), dict):
    raise CheckpointError(f"{path}/{TASK_FILE} is damaged (its \"model\" "
                          f"is {info.get('model')!r}, not an object); {fix}")
  try:
    cfg = ModelConfig.from_dict({**info["model"], **overrides})
  except (ValueError, TypeError) as e:
    raise CheckpointError(f"{path}/{TASK_FILE}: the model config with "
                          f"overrides {overrides} is not valid: {e}") from e
  problem = task_info_problem(info, cfg)
  if problem:
    raise CheckpointError(f"{path}/{TASK_FILE} is damaged ({problem}); "
                          f"{fix}")
  try:
    tokenizer = Tokenizer.find_in(root / TOKENIZER_DIR)
  except Exception as e:  # pylint: disable=broad-except
    # SentencePiece reports an unparsable model as a bare RuntimeError.
    raise CheckpointError(
        f"{path}/{TOKENIZER_DIR} cannot be read as a tokenizer "
        f"({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); it "
        f"is damaged: restore the run's own {TOKENIZER_DIR}/ from a copy, or "
        "fine-tune again.") from e
  if tokenizer is None:
    raise CheckpointError(f"{path} has no {TOKENIZER_DIR}/ holding the "
                          "vocabulary the run featurized its data with.")
  problem = tokenizer_lib.misfit(tokenizer, cfg.vocab_size)
  if problem:
    raise CheckpointError(
        f"{path}/{TOKENIZER_DIR} {problem}: it is not the vocabulary this "
        f"run featurized with; restore the run's own {TOKENIZER_DIR}/.")
  abstract = spec_from_record(info, cfg).abstract_params()
  try:
    wanted = best_step(path) if step == "best" else step
    params, restored = checkpoints.restore_params(path, abstract,
                                                  step=wanted)
  except FileNotFoundError as e:
    raise CheckpointError(f"Fine-tuning workdir {path}: {e}") from e
  except (checkpoint_shapes.CheckpointShapeError,
          checkpoints.UnreadableCheckpointError) as e:
    raise CheckpointError(f"Fine-tuning workdir {path}: {e}") from e
  mesh_axes, sharding_rules = _recorded_sharding(root)
  return FineTuned(task=info["task"], task_type=info["task_type"],
                   labels=info.get("labels"), model_config=cfg,
                   params=params, tokenizer=tokenizer, settings=info,
                   step=restored, path=path, mesh_axes=mesh_axes,
                   sharding_rules=sharding_rules, pack=pack)


def _recorded_sharding(root) -> tuple[Any, Any]:
  """(config.mesh, config.sharding_rules) of the run whose workdir `root`
  is, from its config.json; (None, None) where it has none (prediction then
  takes `albert_jax.sharding`'s defaults, which runs start from)."""
  try:
    config = json.loads((root / RUN_CONFIG_FILE).read_text())
  except (OSError, json.JSONDecodeError):
    return None, None
  if not isinstance(config, dict):
    return None, None
  return config.get("mesh"), config.get("sharding_rules")


def prediction_mesh(mesh_axes=None, sharding_rules=None):
  """(mesh, rules) to predict on when there are several devices, else
  (None, None).

  Args:
    mesh_axes: `config.mesh`'s (name, size) pairs, -1 for the rest of the
      devices; None: `sharding.DEFAULT_MESH`. A mesh the devices present
      cannot form (a run's data=16 × fsdp=4 on a host of 8) is replaced by
      the default, with a warning.
    sharding_rules: `config.sharding_rules`; None: `sharding.DEFAULT_RULES`.
  """
  if jax.device_count() == 1:
    return None, None
  axes = sharding_lib.DEFAULT_MESH if mesh_axes is None else mesh_axes
  rules = (sharding_lib.DEFAULT_RULES if sharding_rules is None
           else sharding_rules)
  try:
    return sharding_lib.mesh_and_rules(axes, rules)
  except ValueError as e:
    mesh, rules = sharding_lib.mesh_and_rules(sharding_lib.DEFAULT_MESH,
                                              rules)
    log.warning("The run's mesh does not fit: %s Predicting on mesh %s "
                "instead.", e, mesh_description(mesh))
    return mesh, rules


def mesh_description(mesh) -> str:
  """A mesh's axes and sizes: "data=4, fsdp=1, tensor=1"."""
  return ", ".join(f"{name}={size}" for name, size in mesh.shape.items())


def _unbox(tree):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.meta.unbox(tree)


################################################################################
# The model.
################################################################################


def inputs_per_row(task_type: str, cfg: ModelConfig, pack: int | None
                   ) -> int:
  """How many inputs a prediction row of a `task_type` model on encoder
  `cfg` holds: `pack` checked, and unset (None) `packing.DEFAULT_PER_ROW`
  where its rows can hold several (the type packs, the encoder is not
  causal) and one elsewhere. 0: one.

  Raises:
    PredictError: not None, 0 or K in [2, packing.MAX_PER_ROW], or K for
      a model whose rows cannot hold several inputs.
  """
  packable = registry.task_type(task_type).packable and not cfg.causal
  try:
    pack = packing.resolve(packing.check_pack(pack), packable)
  except ValueError:
    raise PredictError(
        f"pack={pack!r} must be 0 (one input a row) or K in [2, "
        f"{packing.MAX_PER_ROW}] inputs a row.") from None
  if pack and not packable:
    raise PredictError(
        f"pack={pack}: a {task_type} model"
        + (" on a causal encoder" if cfg.causal else "")
        + " reads one input a row; predict with pack=0.")
  return pack


@dataclasses.dataclass
class FineTuned:
  """A fine-tuned model: encoder, task head, tokenizer and what the task is.

  Attributes:
    task: the task's name ("files", "glue/mrpc", "squad/v2.0", ...).
    task_type: its kind, a key of `registry.task_types()`.
    labels: the label (tag) names in class order; None for regression,
      multiple choice and question answering.
    model_config: the encoder's ModelConfig.
    params: {"albert": encoder, "head": task head} parameters.
    tokenizer: the vocabulary the run featurized with.
    settings: the recorded `task.json` (max_seq_length, the head's and the
      featurization's settings).
    step: the checkpoint's step.
    path: the workdir (or HF directory) it was loaded from.
    mesh_axes: with several devices, the mesh to predict on, as
      `config.mesh` gives it (a fine-tuning workdir's run recorded it);
      None: `sharding.DEFAULT_MESH`. See `prediction_mesh`.
    sharding_rules: the logical axis rules (`config.sharding_rules`);
      None: `sharding.DEFAULT_RULES`.
    pack: inputs a row holds (`albert_jax.finetune.packing`): None for
      `packing.DEFAULT_PER_ROW` where the task type packs (classification,
      regression and tagging on an encoder) and one elsewhere; 0 for one; K >= 2
      for up to K. Each input's outputs are its outputs alone (within
      float rounding), in input order.

  After construction `mesh` is the `jax.sharding.Mesh` predictions run on
  (None on one device, where nothing is sharded), `rules` its rules and
  `pack` the inputs a row holds (0: one).
  """
  task: str
  task_type: str
  labels: Any
  model_config: ModelConfig
  params: Any
  tokenizer: Any
  settings: dict
  step: int | None = None
  path: str | None = None
  mesh_axes: Any = None
  sharding_rules: Any = None
  pack: int | None = None

  def __post_init__(self):
    self.pack = inputs_per_row(self.task_type, self.model_config, self.pack)
    self.params = _unbox(self.params)
    self.labels = None if self.labels is None else tuple(self.labels)
    spec = spec_from_record(self.settings, self.model_config)
    self.module = module = spec.model
    apply = lambda p, b: module.apply({"params": p}, b,  # noqa: E731
                                      deterministic=True)
    self.mesh, self.rules = prediction_mesh(self.mesh_axes,
                                            self.sharding_rules)
    self._data_sharding = None
    if self.mesh is None:
      self._apply = jax.jit(apply)
      return
    # The parameters' logical axes, which their boxes carry.
    boxed = spec.abstract_boxed_params()
    shardings = sharding_lib.logical_shardings(boxed, self.mesh, self.rules)
    self.params = jax.device_put(self.params, shardings)
    self._data_sharding = sharding_lib.data_sharding(self.mesh)
    # Replicated outputs, as training's eval step returns them: every
    # process can read them whole.
    self._apply = jax.jit(
        apply, in_shardings=(shardings, self._data_sharding),
        out_shardings=NamedSharding(self.mesh, P()))

  @contextlib.contextmanager
  def _sharding_context(self):
    """The mesh and logical axis rules the model's activation constraints
    resolve against (nothing on one device)."""
    if self.mesh is None:
      yield
      return
    with sharding_lib.in_mesh(self.mesh, self.rules):
      yield

  @property
  def max_seq_length(self) -> int:
    return int(self.settings["max_seq_length"])

  def __call__(self, features: dict[str, np.ndarray],
               batch_size: int = 32) -> dict[str, np.ndarray]:
    """The head's outputs on featurized rows, run in batches.

    Args:
      features: INPUT_KEYS [N, T] ([N, C, T] for multiple choice) and, for
        question answering, "p_mask" [N, T].
      batch_size: rows per forward pass (the last batch is padded; a
        packed row holds up to `pack` inputs); with several devices,
        rounded up to a multiple of the data axes' size.

    Returns:
      The head's outputs as NumPy arrays with leading dim N, in input order
      (e.g. "logits" [N, L]; "start_logits" and "end_logits" [N, T]).
    """
    keys = INPUT_KEYS + (("p_mask",) if "p_mask" in features else ())
    inputs = {k: features[k] for k in keys}
    ids = np.asarray(inputs["input_ids"])
    if ids.ndim >= 2:  # [N, T], or [N, C, T] for multiple choice
      ids = ids.reshape(-1, ids.shape[-1])
    # The compiled forward sees only shapes: the values are checked here.
    albert_lib.check_ids(ids, self.model_config.vocab_size)
    n = int(inputs["input_ids"].shape[0])
    if n == 0:
      raise PredictError("Nothing to predict: no inputs were given.")
    if self.pack:  # inputs side by side, each with its own [CLS]
      packed = packing.pack(inputs, self.pack)
      inputs = {k: v for k, v in packed.items() if k != packing.SLOT_INDEX}
    # Fewer rows than a batch: the next power of two, so a handful of
    # inputs neither pads to a full batch nor compiles for every count.
    rows = min(int(batch_size),
               1 << (len(inputs["input_ids"]) - 1).bit_length())
    if self.mesh is not None:
      # Each data-parallel device takes an equal share of every batch.
      dp = sharding_lib.data_parallel_size(self.mesh)
      rows = -(-rows // dp) * dp
    parts = []
    batches = batching.ArrayBatches(inputs, rows,
                                    sharding=self._data_sharding)
    with self._sharding_context():
      for batch in batches.eval_batches():
        batch.pop("weights")
        parts.append(jax.device_get(self._apply(self.params, batch)))
    # Padding rows (copies of row 0) are dropped.
    out = {k: np.concatenate([p[k] for p in parts])[:batches.num_rows]
           for k in parts[0]}
    # A packed row's outputs are [K, ...], one per slot: back to inputs.
    if not self.pack:
      return out
    return packing.unpack(out, packed, n,
                          registry.task_type(self.task_type).token_keys)

  def to_hf(self, path: str, model_type: str | None = None) -> None:
    """Writes a transformers task checkpoint (`{Family}For{Task}`, e.g.
    AlbertForSequenceClassification) with id2label / label2id; see
    `albert_jax.interop.hf_task_heads`.

    Raises:
      ValueError: the head or family has no transformers class.
    """
    from albert_jax.interop import hf_task_heads  # pylint: disable=g-import-not-at-top
    hf_task_heads.to_hf(self, path, model_type,
                        registry.task_type(self.task_type))

  def predict(self, inputs, batch_size: int = 32, **options):
    """Predictions on raw inputs (see the module docstring for each type).

    Args:
      inputs: one input, or a list of inputs (a batch).
      batch_size: rows per forward pass.
      **options: question answering takes `null_threshold` (v2.0 heads: an
        answer is dropped where its null odds exceed it; default the
        threshold the run tuned on its eval split, else 0).

    Returns:
      One dict per input (a list for a list of inputs), JSON-serialisable.

    Raises:
      PredictError: inputs of the wrong form for the task type.
    """
    single = not isinstance(inputs, list)
    items = [inputs] if single else inputs
    if not items:
      return []
    out = registry.task_type(self.task_type).predict(self, items,
                                                     batch_size, **options)
    return out[0] if single else out
