"""What a pre-training run optimises: model, loss, initial parameters, FLOPs.

`config.pretraining` picks one member of the family; every one runs on the
same encoder, train step, loop and checkpoints:

- "masked_lm": ALBERT, BERT and RoBERTa. Masked LM, plus a sentence head when
  `config.data.objective` gives sentence labels (SOP for ALBERT, NSP for
  BERT; "none" for RoBERTa's full-sentence packing).
- "electra": ELECTRA's replaced-token detection: a generator samples the
  masked tokens, a discriminator sharing its embeddings finds them (see
  `albert_jax.electra`).
- "causal_lm": GPT-1, the left-to-right baseline: a `model.causal` stack
  predicting every next token with the tied "lm" head, on the contiguous
  text stream of `config.data.objective="none"`.

The trainer (`train.run`), `compile_only` and `report` all ask `setup(config)`
so that they agree on the model a run trains.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from albert_jax import flops as flops_lib
from albert_jax import models
from albert_jax import objectives
from albert_jax import train_step as step_lib
from albert_jax.model_config import ModelConfig

DEFAULT = "masked_lm"


@dataclasses.dataclass(frozen=True)
class Setup:
  """One run's objective, as the trainer needs it.

  Attributes:
    model_config: the (validated) encoder hyperparameters.
    objective: `sums`/`denominators`/`metrics` for
      `train_step.make_train_step` and `make_eval_step`.
    init_params: rng → boxed (logically named) parameters.
    flops_per_step: analytic training FLOPs of one global batch.
    masked: whether the loader masks tokens (MLM-style batches); False gives
      the unmasked token stream with empty `masked_*` arrays.
    batch_shapes: the batch the step reads, key → (shape, dtype), for a
      [batch, seq] batch with `num_predictions` masked slots.
    unigram_baseline: whether the eval reports the most-frequent-target
      accuracy next to `mlm_accuracy`.
  """
  model_config: ModelConfig
  objective: Any
  init_params: Callable[[jax.Array], Any]
  flops_per_step: float
  masked: bool
  batch_shapes: dict[str, tuple[tuple[int, ...], Any]]
  unigram_baseline: bool = True


def sentence_heads(data_objective: str) -> tuple[str, ...]:
  """Pre-training heads for `config.data.objective` (sop / nsp / none)."""
  return ("mlm", "sop") if data_objective in ("sop", "nsp") else ("mlm",)


def checkpoint_heads(config: Mapping[str, Any]) -> tuple[str, ...]:
  """The heads of the `models.Albert` whose parameters a run's checkpoints
  hold, from the run's recorded config (the JSON dict in WORKDIR/config.json).
  """
  if config.get("pretraining") == "electra":
    return ("rtd",)  # the discriminator; electra.part gives the generator
  if config.get("pretraining") == "causal_lm":
    return ("lm",)
  data = config.get("data") or {}
  return sentence_heads(data.get("objective", "sop"))


def masked_batch_shapes(batch: int, seq_len: int, num_predictions: int
                        ) -> dict[str, tuple[tuple[int, ...], Any]]:
  """The loader's masked batch (see data/loader.py): key → (shape, dtype)."""
  b, t, p = batch, seq_len, num_predictions
  return {
      "input_ids": ((b, t), jnp.int32),
      "token_type_ids": ((b, t), jnp.int32),
      "attention_mask": ((b, t), jnp.int32),
      "masked_positions": ((b, p), jnp.int32),
      "masked_ids": ((b, p), jnp.int32),
      "masked_weights": ((b, p), jnp.float32),
      "sentence_labels": ((b,), jnp.int32),
  }


def _masked_lm(config, model_config: ModelConfig) -> Setup:
  heads = sentence_heads(config.data.objective)
  model = models.Albert(model_config, heads=heads)
  seq_len = config.data.max_seq_length
  preds = config.masking.max_predictions

  def init_params(rng):
    ids = jnp.zeros((1, seq_len), jnp.int32)
    return model.init(rng, ids, masked_positions=jnp.zeros(
        (1, preds), jnp.int32))["params"]

  return Setup(
      model_config=model_config,
      objective=step_lib.PretrainingObjective(model),
      init_params=init_params,
      # A row never has more predictions than tokens, whatever the slots.
      flops_per_step=flops_lib.training_flops_per_step(
          model_config, config.batch_size, seq_len, min(preds, seq_len),
          heads=heads),
      masked=True,
      batch_shapes=masked_batch_shapes(config.batch_size, seq_len, preds))


def _electra(config, model_config: ModelConfig) -> Setup:
  from albert_jax import electra  # pylint: disable=g-import-not-at-top
  options = electra.ElectraOptions.from_config(config)
  generator = electra.generator_config(model_config,
                                       options.generator_fraction)
  model = electra.Electra(model_config, generator)
  seq_len = config.data.max_seq_length
  preds = config.masking.max_predictions
  return Setup(
      model_config=model_config,
      objective=electra.ElectraObjective(model, options),
      init_params=electra.init_fn(model, seq_len, preds),
      flops_per_step=electra.training_flops_per_step(
          model_config, generator, config.batch_size, seq_len,
          min(preds, seq_len)),
      masked=True,
      batch_shapes=masked_batch_shapes(config.batch_size, seq_len, preds))


def _causal_lm(config, model_config: ModelConfig) -> Setup:
  if not model_config.causal:
    raise ValueError(
        "config.pretraining='causal_lm' predicts each next token, which a "
        "bidirectional model sees; set --config.model.causal=True.")
  if config.data.objective != "none":
    raise ValueError(
        f"config.pretraining='causal_lm' reads contiguous text, but "
        f"config.data.objective={config.data.objective!r} builds sentence "
        "pairs that are out of order half of the time; set "
        "--config.data.objective=none.")
  heads = ("lm",)
  model = models.Albert(model_config, heads=heads)
  seq_len = config.data.max_seq_length

  def init_params(rng):
    return model.init(rng, jnp.zeros((1, seq_len), jnp.int32))["params"]

  return Setup(
      model_config=model_config,
      objective=objectives.CausalLMObjective(model),
      init_params=init_params,
      # Every position is decoded; causal attention counts half its scores
      # (flops.py, MaxText's convention).
      flops_per_step=flops_lib.training_flops_per_step(
          model_config, config.batch_size, seq_len, heads=heads),
      masked=False,
      # The unmasked loader's batch: its masked_* arrays have no columns.
      batch_shapes=masked_batch_shapes(config.batch_size, seq_len, 0),
      unigram_baseline=False)


_BUILDERS: dict[str, Callable[[Any, ModelConfig], Setup]] = {
    "masked_lm": _masked_lm,
    "electra": _electra,
    "causal_lm": _causal_lm,
}
KINDS = tuple(_BUILDERS)


def kind(config) -> str:
  """`config.pretraining`, checked; configs written before the field existed
  are masked-LM runs."""
  name = config.get("pretraining", DEFAULT) if hasattr(config, "get") else (
      DEFAULT)
  if name not in _BUILDERS:
    close = difflib.get_close_matches(str(name), KINDS, n=1)
    raise ValueError(
        f"config.pretraining={name!r} is not an objective; choose one of "
        f"{KINDS}" + (f" (did you mean {close[0]!r}?)" if close else "") + ".")
  return name


def setup(config, model_config: ModelConfig | None = None) -> Setup:
  """The run's `Setup` from its config (a ConfigDict or the JSON dict the
  trainer records). `model_config` replaces `config.model` (e.g. with a
  16-bit stand-in dtype)."""
  if model_config is None:
    model_config = ModelConfig.from_dict(config.model)
  return _BUILDERS[kind(config)](config, model_config)
