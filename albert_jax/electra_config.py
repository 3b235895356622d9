"""ELECTRA's run settings: `config.electra`, the generator's shape, FLOPs.

Plain Python over `ModelConfig` (no Flax), so config files and the trainer's
FLOPs count can use it without building the model; `albert_jax.electra`
holds the model and objective and re-exports every name here.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

from albert_jax import flops as flops_lib
from albert_jax.model_config import ModelConfig


@dataclasses.dataclass(frozen=True)
class ElectraOptions:
  """`config.electra`: the generator's size, loss weights and sampling.

  Attributes:
    generator_fraction: the generator's hidden size as a fraction of the
      discriminator's, in (0, 1]; the paper uses 1/4 (1/3 for base).
    gen_weight: weight of the generator's MLM loss (official 1).
    disc_weight: weight of the discriminator's loss (official 50).
    temperature: the generator's logits are divided by it before sampling
      (official 1; towards 0 the sample becomes the argmax).
  """
  generator_fraction: float = 0.25
  gen_weight: float = 1.0
  disc_weight: float = 50.0
  temperature: float = 1.0

  def __post_init__(self):
    check_fraction(self.generator_fraction)
    for name in ("gen_weight", "disc_weight"):
      value = getattr(self, name)
      if not _is_number(value) or not 0.0 <= value < math.inf:
        raise ValueError(f"config.electra.{name} must be a finite number "
                         f">= 0, got {value!r}.")
    if self.gen_weight == 0.0 and self.disc_weight == 0.0:
      raise ValueError("config.electra.gen_weight and disc_weight are both "
                       "0, which leaves nothing to train.")
    if not _is_number(self.temperature) or not (
        0.0 < self.temperature < math.inf):
      raise ValueError(f"config.electra.temperature must be a finite number "
                       f"> 0, got {self.temperature!r}.")

  @classmethod
  def from_config(cls, config: Any) -> "ElectraOptions":
    """From a run config's `electra` section (a ConfigDict or JSON dict)."""
    section = config.get("electra") if hasattr(config, "get") else None
    if section is None:
      raise ValueError(
          "config.pretraining='electra' needs a config.electra section "
          f"with {[f.name for f in dataclasses.fields(cls)]}; start from "
          "configs/electra_small.py.")
    values = dict(section)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
      hints = [k + "".join(f" (did you mean {c}?)" for c in
                           difflib.get_close_matches(k, names, n=1))
               for k in unknown]
      raise ValueError(f"Unknown config.electra keys: {', '.join(hints)}; "
                       f"valid: {names}.")
    return cls(**values)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fraction(fraction) -> None:
  """Raises ValueError unless `fraction` is a number in (0, 1]."""
  if not _is_number(fraction) or not 0.0 < fraction <= 1.0:
    raise ValueError(
        f"config.electra.generator_fraction must be in (0, 1]: the "
        f"generator's hidden size as a fraction of the discriminator's "
        f"(the paper: 0.25, 1/3 for base); got {fraction!r}.")


def generator_config(disc: ModelConfig, fraction: float) -> ModelConfig:
  """The generator's hyperparameters, derived as the official code does.

  Hidden size round(fraction · H), heads max(1, hidden // 64), FFN 4·hidden,
  the same depth, sharing, embedding width, vocabulary, positions, dropout
  and dtypes. Where the heads do not divide the hidden size, it moves to the
  nearest multiple of them. An E→H projection exists exactly when the
  generator's width differs from the shared embeddings'.

  Raises:
    ValueError: `fraction` is not in (0, 1].
  """
  check_fraction(fraction)
  hidden = max(1, round(fraction * disc.hidden_size))
  heads = max(1, hidden // 64)
  hidden = max(heads, round(hidden / heads) * heads)
  return dataclasses.replace(
      disc, hidden_size=hidden, num_attention_heads=heads,
      intermediate_size=4 * hidden,
      embedding_projection=hidden != disc.embedding_size)


def rtd_head_flops(cfg: ModelConfig, seq_len: int) -> int:
  """Forward FLOPs of the replaced-token head on one sequence: dense H→H
  and H→1 at every position."""
  return seq_len * (2 * cfg.hidden_size * cfg.hidden_size
                    + 2 * cfg.hidden_size)


def training_flops_per_step(disc: ModelConfig, generator: ModelConfig,
                            batch: int, seq_len: int,
                            num_predictions: int) -> int:
  """Forward + backward FLOPs of one ELECTRA step (see `flops`).

  Generator: its encoder (with its own E→H projection) and the MLM head at
  the masked positions. Discriminator: its encoder and the RTD head at all
  T positions. Both are trained, so both cost 3 × forward; the sampling is
  elementwise and not counted.
  """
  gen = flops_lib.forward_flops_per_sequence(
      generator, seq_len, num_predictions, pooler=False, heads=("mlm",))
  dis = flops_lib.forward_flops_per_sequence(
      disc, seq_len, 0, pooler=False, heads=()) + rtd_head_flops(
          disc, seq_len)
  return flops_lib.TRAINING_MULTIPLIER * batch * (gen + dis)


def pretraining_config(model, *, generator_fraction: float, **run: Any):
  """An ELECTRA run's ConfigDict around a model section (the
  discriminator's): `config_lib.base_config(model, **run)` with ELECTRA's
  data, masking, optimizer and `electra` section.

  Masking is token-level, 15%, and each chosen token becomes [MASK] (85%)
  or stays itself (15%), never a random token. ELECTRA has no sentence-pair
  task: its data builder packs consecutive sentences of one document, in
  order and without a label; the nearest instances here are RoBERTa's packed
  full sentences (`data.objective="none"`), which may also cross documents.
  """
  import ml_collections  # pylint: disable=g-import-not-at-top
  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.base_config(model, objective="none", optimizer="adamw",
                             **run)
  c.pretraining = "electra"
  c.electra = ml_collections.ConfigDict(dataclasses.asdict(
      ElectraOptions(generator_fraction=generator_fraction)))
  c.masking.update(dict(max_ngram=1, whole_word=False, mask_token_prob=0.85,
                        random_token_prob=0.0))
  # The discriminator's accuracy is no measure of progress (its task gets
  # harder as the generator improves); the generator's rises steadily.
  c.best_metric = "mlm_accuracy"
  return c


def smoke_run(c) -> None:
  """Shrinks a config's run, in place, to a CPU smoke test of a minute or so:
  20 steps of 8 × 32 tokens, evaluated and checkpointed at 10 and 20."""
  c.batch_size = 8
  c.num_train_steps = 20
  c.optimizer.warmup_steps = 2
  c.data.max_seq_length = 32
  c.data.eval_fraction = 0.2
  c.masking.max_predictions = 5
  c.log_every_steps = 5
  c.eval_every_steps = c.checkpoint_every_steps = 10
  c.eval_batches = 2
