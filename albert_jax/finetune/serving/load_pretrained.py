"""`albert_jax.load_pretrained`: any checkpoint directory, fine-tuned or not.

A fine-tuning workdir (its `task.json`) or a transformers task checkpoint
(`{Family}For{Task}`) loads with its task head as a
`albert_jax.finetune.serving.fine_tuned.FineTuned`, whose `predict` takes raw text;
everything else is a pre-trained encoder, read by
`albert_jax.interop.pretrained.load_pretrained` into a `Pretrained`. The
readers of each format live in `albert_jax.interop`; this is the one place
above fine-tuning that puts a task head back on.
"""

from __future__ import annotations

import os
from typing import Any

from albert_jax.finetune import registry
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.interop import CheckpointError
from albert_jax.interop import hf_task_heads
from albert_jax.interop import pretrained as pretrained_lib
from albert_jax.interop import sources
from albert_jax.interop import workdir as workdir_lib


def load_pretrained(path: str, step: int | str | None = None,
                    **overrides) -> Any:
  """Loads a checkpoint directory.

  Args:
    path: an HF `save_pretrained` directory (ALBERT, BERT, RoBERTa or
      ELECTRA, a pre-training class or a task class), a
      google-research/albert TF release directory, an albert_jax training
      workdir (its config.json and checkpoints/) or an albert_jax
      fine-tuning workdir; local (`~` expanded) or gs://BUCKET/PATH.
    step: for a workdir, the checkpoint step to read (default: the newest
      readable one; a fine-tuning workdir also takes "best", its run's best
      checkpoint by the task's metric); for a TF release, read
      `model.ckpt-{step}` (default: the only checkpoint, else
      `model.ckpt-best`, else the newest).
    **overrides: ModelConfig fields to change, e.g. dtype="bfloat16" or
      attention_impl="xla"; shape-defining fields must match the weights.
      ELECTRA training workdirs take one more, electra_part (see
      `albert_jax.interop.pretrained.load_pretrained`).

  Returns:
    A `albert_jax.finetune.serving.fine_tuned.FineTuned` for a fine-tuning workdir or
    a transformers task checkpoint, else a
    `albert_jax.interop.pretrained.Pretrained`. Heads the checkpoint lacks
    are listed in `.missing` and logged; they are never initialised
    randomly behind the user's back.

  Raises:
    CheckpointError: not a checkpoint directory, an unsupported model type,
      unreadable weights, a workdir without checkpoints, a config whose
      shapes differ from the weights' (the message lists the mismatched
      tensors), or electra_part for anything but an ELECTRA workdir.
  """
  path = os.fspath(path)
  if workdir_lib.is_finetune_workdir(path):
    if "electra_part" in overrides:
      raise CheckpointError(
          f"electra_part applies to ELECTRA pre-training workdirs; {path} "
          "is a fine-tuning workdir, which holds one encoder.")
    return predict_lib.load(path, step, **overrides)
  loaded = sources.load(path, step, overrides)
  if isinstance(loaded, sources.TaskCheckpoint):
    kind = registry.task_type_of_hf(loaded.task_class, loaded.hf_config)
    if kind is None:
      classes = sorted({k.hf_class for k in registry.task_types().values()
                        if k.hf_class})
      raise CheckpointError(
          f"{loaded.source} holds a transformers {loaded.task_class} model, "
          f"which albert_jax has no task type for; it reads "
          f"{', '.join(classes)} (and encoder classes).")
    try:
      fields = hf_task_heads.from_hf(loaded, kind)
    except (ValueError, KeyError, TypeError) as e:
      raise CheckpointError(f"{loaded.source}: {e}") from e
    return predict_lib.FineTuned(tokenizer=loaded.tokenizer, **fields)
  return pretrained_lib.from_fields(path, loaded)
