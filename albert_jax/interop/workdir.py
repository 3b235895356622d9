"""albert_jax's own workdirs: which kind a directory is, and
`load_pretrained` on a training workdir.

The model is rebuilt from the trainer's config.json `model` section, its heads
from `data.objective`, and only the parameters of the newest (or a chosen)
checkpoint are read, onto one CPU device, without the optimizer state. A
fine-tuning workdir is told by its `TASK_FILE`, which the fine-tuning run
writes (`albert_jax.finetune.serving.fine_tuned.record`) and `albert_jax.load_pretrained`
reads back into a `FineTuned`.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from albert_jax import storage
from albert_jax.interop import CheckpointError
from albert_jax.interop import child
from albert_jax.model import albert as albert_lib
from albert_jax.model import electra
from albert_jax.model.config import ModelConfig
from albert_jax.text import run_tokenizer
from albert_jax.training import checkpoint_shapes
from albert_jax.training import checkpoints
from albert_jax.training import defaults
from albert_jax.training import run_spec

log = logging.getLogger(__name__)

# What a fine-tuning run records in its workdir besides the trainer's files:
# the task, its labels and the model (`finetune.serving.fine_tuned.record`).
TASK_FILE = "task.json"


def is_finetune_workdir(path: str) -> bool:
  """Whether `path` holds a fine-tuning run's `TASK_FILE`."""
  return storage.path(os.fspath(path)).joinpath(TASK_FILE).is_file()


def read_workdir_config(path: str) -> dict | None:
  """The trainer's resolved config (config.json), with the fields its
  version did not write (`defaults.upgrade`), or None for an HF dir.

  A trainer config is a JSON object with a `model` section; an HF config is
  flat (`model_type`, `hidden_size`, ...). A `checkpoints/` directory without
  a trainer config is an error rather than an HF directory.
  """
  config_path = child(path, "config.json")
  has_checkpoints = storage.path(child(path, "checkpoints")).is_dir()
  if not storage.path(config_path).exists():
    if has_checkpoints:
      raise CheckpointError(
          f"{path} has checkpoints/ but no config.json; the trainer writes "
          "the run's config there, which is needed to rebuild the model.")
    return None
  try:
    config = json.loads(storage.path(config_path).read_bytes())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    if has_checkpoints:
      raise CheckpointError(f"{config_path} is not readable JSON: {e}") from e
    return None  # the HF path reports its own error
  if isinstance(config, dict) and isinstance(config.get("model"), dict):
    return defaults.upgrade(config)
  if has_checkpoints and "model_type" not in config:
    raise CheckpointError(
        f"{config_path} has no `model` section; expected the config.json "
        "that albert_jax's trainer writes into its workdir.")
  return None


def load(path: str, config: Mapping[str, Any], step: int | None,
         overrides: Mapping[str, Any]) -> dict[str, Any]:
  """The fields of a `Pretrained` for workdir `path` with trainer `config`.

  `overrides` are ModelConfig fields, plus for an ELECTRA run (config
  `pretraining="electra"`) `electra_part`: "discriminator" (default; HF's
  ElectraForPreTraining) or "generator" (ElectraForMaskedLM). Either way the
  whole ELECTRA tree is read and the part taken from it.
  """
  overrides = dict(overrides)
  electra_part = overrides.pop("electra_part", None)
  note = f" with overrides {overrides}" if overrides else ""
  try:
    cfg = ModelConfig.from_dict({**config["model"], **overrides})
  except (ValueError, TypeError) as e:
    raise CheckpointError(
        f"{path}/config.json: the model section{note} is not a valid "
        f"ModelConfig: {e}") from e
  try:
    spec = run_spec.run_spec(config, cfg, batch_size=1, seq_len=1,
                             num_predictions=1)
  except (ValueError, KeyError, AttributeError) as e:
    raise CheckpointError(f"Workdir {path}: its config.json does not "
                          f"describe a pre-training run: {e}") from e
  is_electra = spec.kind == "electra"
  if electra_part is not None and not is_electra:
    raise CheckpointError(
        f"electra_part={electra_part!r} applies to ELECTRA runs; {path} "
        f"was trained with pretraining={spec.kind!r}.")
  if is_electra:
    electra_part = electra_part or "discriminator"
    if electra_part not in electra.PARTS:
      raise CheckpointError(f"Workdir {path}: electra_part={electra_part!r};"
                            f" choose one of {electra.PARTS}.")
    abstract = spec.abstract_params()
    what = (f"an ELECTRA model (generator H="
            f"{spec.generator_config.hidden_size})")
  else:
    objective = config["data"]["objective"]
    heads = spec.heads
    abstract = albert_lib.abstract_params(cfg, True, heads)
    what = f"objective {objective!r}, heads {heads}"
  try:
    params, restored_step = checkpoints.restore_params(path, abstract,
                                                       step=step)
  except FileNotFoundError as e:
    raise CheckpointError(f"Workdir {path}: {e}") from e
  except checkpoint_shapes.CheckpointShapeError as e:
    raise CheckpointError(
        f"Workdir {path}: its config.json{note} ({what}) does not describe "
        f"the model in checkpoint step {e.step}.\n{e}") from e
  except checkpoints.UnreadableCheckpointError as e:
    raise CheckpointError(f"Workdir {path}: {e}") from e
  pooler, model_type = True, None
  if is_electra:
    cfg, params, heads = electra.part(params, cfg, spec.generator_config,
                                      electra_part)
    pooler, model_type = False, "electra"
  params = jax.tree.map(lambda x: jnp.asarray(x, cfg.parameter_dtype), params)
  return dict(model_config=cfg, params=params,
              tokenizer=run_tokenizer.find(config, path), heads=heads,
              pooler=pooler,
              missing=(), step=restored_step, model_type=model_type)
