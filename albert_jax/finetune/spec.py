"""What a fine-tuning run trains: `FineTuneSpec`, the twin of
`albert_jax.training.run_spec.RunSpec`.

One description of a fine-tuned model: the encoder's hyperparameters, the
task head, the optional next-token head and the features a row holds. It is
built from the task being trained (`for_task`: the fine-tuning run and
`--compile_only`) or from what a fine-tuning workdir recorded
(`albert_jax.finetune.serving.fine_tuned.spec_from_record`: prediction), and gives
them all the same model, initial parameters, batch schema and FLOPs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from albert_jax.finetune import packing
from albert_jax.finetune.task import FineTuneModel
from albert_jax.finetune.task import Task
from albert_jax.model import flops as flops_lib
from albert_jax.model.config import ModelConfig

# The loop's own feature: 1 for real rows, 0 for rows padding a batch.
WEIGHTS = ("weights", ((), np.float32))


@dataclasses.dataclass(frozen=True)
class FineTuneSpec:
  """One fine-tuned model.

  Attributes:
    model_config: the encoder's hyperparameters.
    head: the task head module (`Task.head`).
    lm_head: whether the model keeps the tied next-token "lm" head (GPT-1's
      auxiliary loss, `config.lm_aux_weight` > 0).
    features: name → (shape of one row, dtype) of the features the model,
      the loss and the predictions read (`Task.batch_features`); INPUT_KEYS
      are [T], or [C, T] for C choices.
  """
  model_config: ModelConfig
  head: nn.Module
  lm_head: bool
  features: dict[str, tuple[tuple[int, ...], Any]]

  @functools.cached_property
  def model(self) -> FineTuneModel:
    """The encoder with the task head: the one place it is built."""
    return FineTuneModel(self.model_config, self.head, lm_head=self.lm_head)

  def example_batch(self, rows: int = 1) -> dict[str, np.ndarray]:
    """`rows` rows of zeros of every feature (for shapes and tracing)."""
    return {k: np.zeros((rows,) + shape, dtype)
            for k, (shape, dtype) in self.features.items()}

  def init_params(self, rng: jax.Array) -> Any:
    """rng → boxed (logically named) parameters."""
    return self.model.init(rng, self.example_batch(),
                           deterministic=True)["params"]

  def abstract_boxed_params(self) -> Any:
    """The boxed parameters as ShapeDtypeStructs (nothing allocated): their
    logical axes, for sharding them."""
    return jax.eval_shape(self.init_params, jax.random.key(0))

  def abstract_params(self) -> Any:
    """The unboxed parameters as ShapeDtypeStructs (nothing allocated)."""
    return nn.meta.unbox(self.abstract_boxed_params())

  def batch_schema(self, batch_size: int
                   ) -> dict[str, tuple[tuple[int, ...], Any]]:
    """A global batch of `batch_size` rows: name → (shape, dtype), with the
    loop's "weights"."""
    name, (shape, dtype) = WEIGHTS
    return {**{k: ((batch_size,) + s, d)
               for k, (s, d) in self.features.items()},
            name: ((batch_size,) + shape, dtype)}

  @property
  def seq_len(self) -> int:
    return self.features["input_ids"][0][-1]

  def sequences(self, batch_size: int) -> int:
    """Sequences the encoder reads in `batch_size` rows (each choice of a
    multiple-choice row is one)."""
    return batch_size * math.prod(self.features["input_ids"][0][:-1])

  @property
  def tokens_per_row(self) -> int:
    return math.prod(self.features["input_ids"][0])

  def flops_per_step(self, batch_size: int) -> int:
    """Analytic training FLOPs of `batch_size` rows (3 × forward; the
    task head's few FLOPs not counted)."""
    return flops_lib.training_flops_per_step(
        self.model_config, self.sequences(batch_size), self.seq_len, 0,
        heads=self._heads)

  def attention_flops_per_step(self, batch_size: int) -> int:
    """The attention scores' share of `flops_per_step`."""
    attention = flops_lib.forward_flops_breakdown(
        self.model_config, self.seq_len, 0,
        heads=self._heads)["attention_scores"]
    return flops_lib.TRAINING_MULTIPLIER * self.sequences(
        batch_size) * attention

  @property
  def _heads(self) -> tuple[str, ...]:
    return ("lm",) if self.lm_head else ()


def pack_for(task: Task, pack: int | None, lm_head: bool,
             causal: bool = False) -> int:
  """K, the examples a row of `task` holds: `config.data.pack` as given
  (`packing.check_pack`), or unset (None) `packing.DEFAULT_PER_ROW` where
  the rows can pack and 0 where they cannot.

  Raises:
    ValueError: an explicit K > 0 for a task whose rows are not single
      examples (multiple choice, SQuAD windows), with the next-token head (its targets
      would cross examples), or on a causal model (its summary token is an
      example's last, which packed rows do not point at).
  """
  pack = packing.resolve(packing.check_pack(pack),
                         task.packable and not lm_head and not causal)
  if not pack:
    return 0
  if not task.packable:
    raise ValueError(
        f"config.data.pack={pack}: task {task.name!r} does not pack (only "
        "classification, regression and tagging, whose rows are single "
        "examples, do); set --config.data.pack=0.")
  if lm_head:
    raise ValueError(
        f"config.data.pack={pack} with config.lm_aux_weight > 0: the "
        "next-token loss would predict across packed examples; set one of "
        "them to 0.")
  if causal:
    raise ValueError(
        f"config.data.pack={pack} on a causal model: its classifier reads "
        "each example's last token, and packed rows point at their first; "
        "set --config.data.pack=0.")
  return pack


def for_task(task: Task, model_config: ModelConfig, max_seq_length: int,
             lm_head: bool = False, pack: int = 0) -> FineTuneSpec:
  """The spec of fine-tuning `model_config`'s encoder on `task`, with up to
  `pack` examples a row (`finetune.packing`; 0: one).

  Raises:
    ValueError: `pack` for a task whose rows cannot hold several examples,
      or with the next-token head (its targets would cross examples).
  """
  features = task.batch_features(max_seq_length)
  if pack:
    # Refuses rows that cannot pack.
    pack_for(task, pack, lm_head, model_config.causal)
    features = packing.packed_features(features, pack, task.token_keys)
  return FineTuneSpec(model_config, task.head(model_config), lm_head,
                      features)
