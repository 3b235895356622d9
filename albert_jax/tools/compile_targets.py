"""What `compile_only` compiles: the train step a config would run.

A pre-training config (`config.pretraining`: masked_lm, electra or
causal_lm) gives its `RunSpec`'s model, objective and batch. A fine-tuning
config (`config.job="finetune"`) gives the task's model (the encoder with
the task head) and objective, with the batch the task's features would
fill: no data is featurized (a "files" task still reads its files, for its
label set), and the model comes from the checkpoint at `config.init` (its
weights are loaded and dropped), or from a complete `config.model` when
`config.init` is empty.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from albert_jax.model import flops as flops_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import run_spec

# XLA:CPU has no bfloat16 arithmetic: its float normalisation widens bfloat16
# ops to float32, and with them the buffers they write, so a bfloat16 model
# compiled for CPU reports nearly its float32 footprint (ALBERT-base at 64
# sequences of 512 per device: 61.8 GiB of temporaries in bfloat16, 63.6 in
# float32, 41.2 in float16). float16 it keeps in 16 bits, and the program is
# otherwise the same (LayerNorm, softmax and the losses run in float32
# either way), so on CPU a bfloat16 dtype is compiled as float16: same bytes
# as bfloat16 on an accelerator.
BF16_STAND_IN = "float16"


@dataclasses.dataclass(frozen=True)
class Target:
  """One train step to compile.

  Attributes:
    name: "masked_lm", "electra", "causal_lm" or "finetune <task>".
    model_config: the encoder's hyperparameters as compiled.
    init_params: rng → boxed (logically named) parameters.
    objective: the train step's objective (`objectives.Objective`).
    batch_schema: the global batch, key → (shape, dtype).
    flops_per_step: analytic training FLOPs of one global batch
      (`model.flops`: matmuls only, 3 × forward).
    attention_flops_per_step: the part of it in attention's two T × T
      matmuls (QKᵀ and PV).
    bf16_as_float16: bfloat16 was compiled as float16 (CPU).
    examples_per_row: K, the examples (a fine-tune's) or instances
      (pre-training's) packed a row (0: one a row).
  """
  name: str
  model_config: ModelConfig
  init_params: Callable[[jax.Array], Any]
  objective: Any
  batch_schema: dict[str, tuple[tuple[int, ...], Any]]
  flops_per_step: int
  attention_flops_per_step: int
  bf16_as_float16: bool
  examples_per_row: int = 0


def stand_in(cfg: ModelConfig, platform: str,
             enabled: bool = True) -> tuple[ModelConfig, bool]:
  """On CPU, `cfg` with bfloat16 dtypes as float16; whether any changed."""
  changes = {key: BF16_STAND_IN for key in ("dtype", "param_dtype")
             if enabled and platform == "cpu"
             and getattr(cfg, key) == "bfloat16"}
  return (dataclasses.replace(cfg, **changes) if changes else cfg,
          bool(changes))


def for_config(config, platform: str, stand_in_16bit: bool = True) -> Target:
  """The train step of `config` (pre-training or fine-tuning), compiled for
  `platform` ("tpu", "cpu", ...): the dispatcher, where the config becomes
  `pretrain`'s `RunSpec` or `finetune`'s sections and values.

  Reads: job and model; for a fine-tune, init, data, batch_size and
  lm_aux_weight; for pre-training, what `run_spec.run_spec` reads.
  """
  if config.job == "finetune":
    cfg, changed = stand_in(finetune_model_config(config.model, config.init),
                            platform, stand_in_16bit)
    return finetune(config.data, cfg, changed, batch_size=config.batch_size,
                    lm_aux_weight=config.lm_aux_weight, init=config.init)
  cfg, changed = stand_in(ModelConfig.from_dict(config.model), platform,
                          stand_in_16bit)
  return pretrain(run_spec.run_spec(config, cfg), changed)


def pretrain(spec: run_spec.RunSpec, bf16_as_float16: bool) -> Target:
  """The pre-training step of a run's `RunSpec` (of `config.pretraining`'s
  objective, its model config as compiled); `bf16_as_float16`: `stand_in`
  changed it."""
  attention = sum(v for k, v in spec.forward_flops().items()
                  if k.endswith("attention_scores"))
  return Target(spec.kind, spec.model_config, spec.init_params,
                spec.objective, spec.batch_schema, spec.flops_per_step,
                flops_lib.TRAINING_MULTIPLIER * spec.batch_size * attention,
                bf16_as_float16, examples_per_row=spec.max_per_row)


def finetune_model_config(model, init: str) -> ModelConfig:
  """The fine-tuned encoder's configuration: `config.init`'s with
  `config.model`'s non-empty fields over it, or `config.model` alone.

  Args:
    model: the fine-tuning config's `config.model` section (None: the
      checkpoint's value).
    init: `config.init`, the checkpoint ("": none).
  """
  overrides = {k: v for k, v in model.items() if v is not None}
  if init:
    from albert_jax.finetune.serving.load_pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
    return load_pretrained(init, **overrides).model_config
  missing = sorted(k for k, v in model.items() if v is None)
  if missing:
    raise ValueError(
        "Compiling a fine-tuning step needs the starting model: set "
        "config.init to a checkpoint, or every config.model field (missing: "
        f"{', '.join(missing)}).")
  return ModelConfig.from_dict(overrides)


def finetune(data, model_config: ModelConfig, bf16_as_float16: bool, *,
             batch_size: int, lm_aux_weight, init: str) -> Target:
  """The fine-tuning step of `data.task` on the starting model.

  Args:
    data: the run's `config.data` section (task, pack, max_seq_length).
    model_config: the starting model's, as compiled
      (`finetune_model_config`, then `stand_in`).
    bf16_as_float16: `stand_in` changed it.
    batch_size: rows per step (`config.batch_size`).
    lm_aux_weight: `config.lm_aux_weight`, checked against the model
      (`starting_point.lm_aux_weight`).
    init: `config.init`, which that check's error names.
  """
  from albert_jax.finetune import registry  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune import starting_point as finetune_start  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune.task import TaskObjective  # pylint: disable=g-import-not-at-top
  task = registry.make_task(data.task, data)
  lm_weight = finetune_start.lm_aux_weight(lm_aux_weight, model_config, init)
  pack = spec_lib.pack_for(task, data.pack, lm_weight > 0,
                           model_config.causal)
  spec = spec_lib.for_task(task, model_config, data.max_seq_length,
                           lm_head=lm_weight > 0, pack=pack)
  return Target(f"finetune {task.name}", model_config, spec.init_params,
                TaskObjective(spec.model, task, lm_weight),
                spec.batch_schema(batch_size),
                spec.flops_per_step(batch_size),
                spec.attention_flops_per_step(batch_size), bf16_as_float16,
                examples_per_row=pack)
