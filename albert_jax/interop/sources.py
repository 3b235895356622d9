"""`load_pretrained`'s sources: which kind of checkpoint a directory holds,
read by that kind's loader.

Accepts:
  * a directory written by transformers' `save_pretrained` for ALBERT
    (`AlbertForPreTraining`, `AlbertForMaskedLM`, `AlbertModel`), BERT
    (`BertForPreTraining`, `BertForMaskedLM`, `BertForNextSentencePrediction`,
    `BertModel`), RoBERTa (`RobertaForMaskedLM`, `RobertaModel`) or ELECTRA
    (`ElectraForPreTraining`, `ElectraForMaskedLM`, `ElectraModel`). Weights
    are read from safetensors; nothing is ever unpickled (see
    `albert_jax.interop.hf_files`). A transformers task checkpoint
    (`{Family}For{Task}`) is read as it is (`TaskCheckpoint`):
    `albert_jax.load_pretrained` converts it with its task head into a
    fine-tuned model.
  * a google-research/albert TF1 release directory (`albert_config.json`,
    `model.ckpt-*`, `30k-clean.model`), through TensorFlow.
  * an albert_jax training workdir (the trainer's `config.json` and
    `checkpoints/`).

An albert_jax fine-tuning workdir (its `task.json`) is refused here: it is
read with its task head by `albert_jax.load_pretrained`, above fine-tuning
(`albert_jax.finetune.serving.load_pretrained`), which comes to these loaders only for the
kinds above. Directories are local (`~` expanded) or `gs://BUCKET/...`.
"""

from __future__ import annotations

import os
import typing
from typing import Any

import jax
import jax.numpy as jnp

from albert_jax import storage
from albert_jax.interop import CheckpointError
from albert_jax.interop import child
from albert_jax.interop import hf
from albert_jax.interop import hf_config as hf_config_lib
from albert_jax.interop import hf_task_heads
from albert_jax.interop import tensor_map
from albert_jax.interop import tf_checkpoint
from albert_jax.interop import workdir as workdir_lib
from albert_jax.interop.hf_files import read_state_dict
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig


class TaskCheckpoint(typing.NamedTuple):
  """A transformers task checkpoint, read but not converted: its task
  type's conversion (`hf_task_heads.from_hf`) lives above interop.

  Attributes:
    path: its directory.
    task_class: its transformers class less the family's name
      (`hf_task_heads.task_class`), which names its task type.
    hf_config: its parsed config.json.
    state: its tensors by transformers' names.
    overrides: ModelConfig fields to change.
    tokenizer: its tokenizer, or None.
    source: how errors name it ("Checkpoint PATH (with overrides ...)").
  """
  path: str
  task_class: str
  hf_config: dict[str, Any]
  state: dict[str, Any]
  overrides: dict[str, Any]
  tokenizer: Any
  source: str


def load(path: str, step: int | str | None,
         overrides: dict[str, Any]) -> Any:
  """Reads the checkpoint directory `path` by its kind; `step` and
  `overrides` are `albert_jax.interop.pretrained.load_pretrained`'s.

  Returns:
    For a transformers task checkpoint, a `TaskCheckpoint`; otherwise the
    fields of a `Pretrained` but its `config` (a dict of model_config,
    params, tokenizer, heads, pooler, missing, step and model_type).

  Raises:
    CheckpointError: as `load_pretrained` says.
  """
  path = os.fspath(path)
  if not storage.path(path).is_dir():
    raise CheckpointError(
        f"{path} is not a directory" + (" (no object is stored under it)."
                                        if storage.is_remote(path) else "."))
  if workdir_lib.is_finetune_workdir(path):
    raise CheckpointError(
        f"{path} is a fine-tuning workdir (it has {workdir_lib.TASK_FILE}): "
        "load it with albert_jax.load_pretrained, which returns the model "
        "with its task head.")
  if step == "best":
    raise CheckpointError(
        f"step='best' applies to fine-tuning workdirs (their run's best "
        f"checkpoint by the task's metric); {path} is not one (it has no "
        f"{workdir_lib.TASK_FILE}).")
  workdir_config = workdir_lib.read_workdir_config(path)
  if workdir_config is not None and workdir_config.get("job") == "finetune":
    raise CheckpointError(
        f"{path} is a fine-tuning workdir without "
        f"{workdir_lib.TASK_FILE}, which albert_jax writes there since it "
        "reloads fine-tuned models; rerun the fine-tuning with this "
        "version (it resumes from the newest checkpoint and records it).")
  if workdir_config is not None:
    return workdir_lib.load(path, workdir_config, step, overrides)
  if "electra_part" in overrides:
    raise CheckpointError(
        f"electra_part={overrides['electra_part']!r} applies to ELECTRA "
        f"training workdirs only (an albert_jax workdir of a "
        f"pretraining='electra' run, which stores generator and "
        f"discriminator together); {path} is not a training workdir. An HF "
        "ELECTRA directory holds one part already (ElectraForPreTraining: "
        "the discriminator, ElectraForMaskedLM: the generator): load it "
        "without electra_part.")
  if tf_checkpoint.is_release_dir(path):
    loaded = tf_checkpoint.load(path, step, overrides)
    return _finish(path, "albert", **loaded)
  if step is not None:
    raise CheckpointError(
        f"step={step} applies to albert_jax training workdirs and TF "
        f"checkpoints; {path} is neither (it has no trainer config.json with "
        f"checkpoints/ and no {tf_checkpoint.CONFIG_FILE}).")
  if not storage.path(child(path, "config.json")).exists():
    raise CheckpointError(
        f"{path} has no config.json; expected a directory written by "
        "transformers' save_pretrained, or an official ALBERT release "
        f"with {tf_checkpoint.CONFIG_FILE}.")
  note = f" (with overrides {overrides})" if overrides else ""
  try:
    hf_config = hf_config_lib.read_config(path)
    model_type = hf_config_lib.model_type_of(hf_config)
    task_class = hf_task_heads.task_class(hf_config)
  except (ValueError, TypeError) as e:
    raise CheckpointError(f"{path}/config.json{note}: {e}") from e
  if task_class is not None:
    source = f"Checkpoint {path}{note}"
    try:
      state = read_state_dict(path)
    except (ValueError, KeyError, TypeError) as e:
      raise CheckpointError(f"{source}: {e}") from e
    return TaskCheckpoint(path, task_class, hf_config, state, overrides,
                          _tokenizer(path), source)
  try:
    cfg = hf_config_lib.config_from_hf(hf_config)
    if overrides:
      cfg = ModelConfig.from_dict({**cfg.to_dict(), **overrides})
  except (ValueError, TypeError) as e:
    raise CheckpointError(f"{path}/config.json{note}: {e}") from e
  state = read_state_dict(path)
  try:
    params, parts = hf.params_from_hf(state, cfg, model_type)
  except ValueError as e:
    raise CheckpointError(f"Checkpoint {path}{note}: {e}") from e
  return _finish(path, model_type, model_config=cfg, params=params,
                 parts=parts, step=None, source=f"Checkpoint {path}")



def _finish(path: str, model_type: str, *, model_config: ModelConfig,
            params, parts, step, source: str) -> dict[str, Any]:
  """Checks converted weights against the model; `Pretrained`'s fields but
  its `config`."""
  cfg = model_config
  if parts["sop"] and not parts["pooler"]:
    raise CheckpointError(
        f"{source} has a sentence-order head but no pooler, which that head "
        "reads; it is not a layout transformers writes.")
  heads = tuple(h for h in albert_lib.ALL_HEADS if parts.get(h))
  expected = albert_lib.abstract_params(cfg, parts["pooler"], heads)
  tensor_map.check_shapes(params, expected, source)
  missing = tuple(p for p in hf_config_lib.PARTS[model_type] if not parts[p])
  params = jax.tree.map(lambda x: jnp.asarray(x, cfg.parameter_dtype), params)
  return dict(model_config=cfg, params=params, tokenizer=_tokenizer(path),
              heads=heads, pooler=parts["pooler"], missing=missing, step=step,
              model_type=model_type)


def _tokenizer(path: str):
  """The directory's tokenizer (spiece.model, tokenizer.json, vocab.txt,
  *.model), or None."""
  from albert_jax.text.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  return Tokenizer.find_in(path)
