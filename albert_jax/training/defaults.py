"""The run config's fields that were added after workdirs began recording
their config, each with its default written once, and `upgrade`.

A workdir's config.json (`run_setup.record_config`) holds the config as the
version that ran it wrote it: a field added since is missing there. The
presets (`albert_jax.config_lib`) take these fields' values from the tables
below, and whatever reads a recorded config (`load_pretrained` on a
training workdir, `tools.report`, `tools.cross_eval`) reads it through
`upgrade`, which fills each missing field with the value that meant what
the older version did. So the code reads `config.KEY` directly, and a
config built by hand goes through `upgrade` too.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping

from albert_jax.training import goodput
from albert_jax.training import profiling

# Every run's, pre-training or fine-tuning.
RUN: dict[str, Any] = {
    # A run leases its workdir; True takes over another run's live lease.
    "take_over_workdir": False,
    # Steps with a NaN/Inf loss or gradient are skipped; this many in a row
    # stop the run (saved, with the offending parameters named).
    "max_consecutive_nonfinite": 20,
    # On CPU: compile with fewer XLA optimisations (smoke runs, debugging).
    "fast_compile": False,
    "optimizer": {
        # "polynomial" (ALBERT's) or "cosine" (GPT-1's; training/optimizer.py).
        "schedule": "polynomial",
        # ELECTRA's layer-wise decay of the rate when fine-tuning an unshared
        # stack (training/optimizer.py, layer_lr_multipliers); 1.0: off.
        "layerwise_lr_decay": 1.0},
    # Where the time goes (training/profiling.py, training/goodput.py):
    # profile.num_steps > 0 traces that many steps (from profile.start_step,
    # -1: the third step after a (re)start; again every profile.period steps
    # if > 0; on the process indices in profile.hosts, (): all) into
    # WORKDIR/profile with its step breakdown. goodput: the data-wait share
    # of step time that is warned about, and how many times the median step
    # time makes a step slow.
    "profile": dataclasses.asdict(profiling.ProfileOptions()),
    "goodput": dataclasses.asdict(goodput.GoodputOptions()),
}

# A pre-training run's (a config without `job`).
PRETRAINING: dict[str, Any] = {
    "job": "pretrain",
    # masked_lm (ALBERT, BERT, RoBERTa); see albert_jax/training/run_spec.py.
    "pretraining": "masked_lm",
    "data": {
        # Objective "none" only: cut the token stream into windows of
        # exactly max_seq_length, as GPT-1 did, instead of ending rows at
        # sentence ends.
        "exact_length": False,
        # K >= 2 packs up to K instances into each row when the data is
        # prepared; 0 writes one instance per row.
        "pack": 0},
    # Of the chosen tokens: [MASK], a random token, the rest unchanged
    # (BERT's 80/10/10).
    "masking": {"mask_token_prob": 0.8, "random_token_prob": 0.1},
}

# A fine-tuning run's (`job="finetune"`).
FINETUNING: dict[str, Any] = {
    # λ of GPT-1's fine-tuning loss, task + λ × next-token loss on the task's
    # input text (causal models only; GPT-1 used 0.5). 0: the task loss only.
    "lm_aux_weight": 0.0,
    # True: the [CLS] pooler starts from random values instead of the
    # checkpoint's.
    "reinit_pooler": False,
    # One example a row (the presets' None packs where rows can hold
    # several; albert_jax/finetune/packing.py).
    "data": {"pack": 0},
}


def _fill(tree, table: Mapping[str, Any]) -> None:
  """Sets, in place, each field of `table` that `tree` lacks."""
  for key, default in table.items():
    if key not in tree:
      tree[key] = copy.deepcopy(default)
    elif isinstance(default, Mapping) and hasattr(tree[key], "keys"):
      _fill(tree[key], default)


def _complete(config, job: str | None = None) -> None:
  job = job or config.get("job")
  _fill(config, RUN)
  if job == "finetune":
    _fill(config, FINETUNING)
    return
  _fill(config, PRETRAINING)
  stage = config.get("finetune")  # the demo's fine-tuning stage
  if stage is not None and hasattr(stage, "keys"):
    _complete(stage, "finetune")


def upgrade(recorded: Mapping[str, Any]) -> dict[str, Any]:
  """A copy of `recorded` (a workdir's config.json object, or a config)
  with every field of RUN and of its job's table that it lacks set to its
  default, a pre-training config's fine-tuning stage (`finetune`)
  included. The fields it has are kept as they are."""
  config = copy.deepcopy(recorded.to_dict() if hasattr(recorded, "to_dict")
                         else dict(recorded))
  _complete(config)
  return config


def fill(config) -> None:
  """`upgrade` in place, for the ConfigDict a run starts from (a config
  file of an earlier version, or one built by hand)."""
  with config.unlocked():
    _complete(config)
