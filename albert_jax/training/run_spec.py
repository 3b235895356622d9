"""What a pre-training run trains: `RunSpec`, the one description of a run.

`config.pretraining` picks one member of the family; every one runs on the
same encoder, train step, loop and checkpoints:

- "masked_lm": ALBERT, BERT and RoBERTa. Masked LM, plus a sentence head when
  `config.data.objective` gives sentence labels (SOP for ALBERT, NSP for
  BERT; "none" for RoBERTa's full-sentence packing).
- "electra": ELECTRA's replaced-token detection: a generator samples the
  masked tokens, a discriminator sharing its embeddings finds them
  (`albert_jax.model.electra`, `albert_jax.training.electra`).
- "causal_lm": GPT-1, the left-to-right baseline: a `model.causal` stack
  predicting every next token with the tied "lm" head, on the contiguous
  text stream of `config.data.objective="none"`.

The trainer, `tools.compile_only`, `tools.summary`, `tools.report` and
workdir loading all read `run_spec(config)`, so they agree on the model a
run trains, its parameters, its batches and its FLOPs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from albert_jax import hints
from albert_jax.data import loader as loader_lib
from albert_jax.data import masking as masking_lib
from albert_jax.data import pipeline
from albert_jax.model import albert as albert_lib
from albert_jax.model import electra as electra_model
from albert_jax.model import flops as flops_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import electra as electra_lib
from albert_jax.training import objectives

KINDS = ("masked_lm", "causal_lm", "electra")
# The held-out metrics a run of each kind can keep its best checkpoint by:
# higher is better for each (the checkpoint manager keeps the maximum).
BEST_METRICS = {
    "masked_lm": ("mlm_accuracy", "sop_accuracy"),
    "causal_lm": ("lm_accuracy",),
    "electra": ("mlm_accuracy", "rtd_accuracy", "rtd_precision",
                "rtd_recall"),
}


def kind(config) -> str:
  """`config.pretraining`, checked (configs written before the field
  existed are masked-LM runs: `defaults.upgrade`)."""
  name = config["pretraining"]
  if name not in KINDS:
    raise ValueError(
        f"config.pretraining={name!r} is not an objective; choose one of "
        f"{KINDS}{hints.did_you_mean(name, KINDS)}.")
  return name


def sentence_heads(data_objective: str) -> tuple[str, ...]:
  """Masked-LM heads for `config.data.objective` (sop / nsp / none)."""
  return ("mlm", "sop") if data_objective in ("sop", "nsp") else ("mlm",)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One pre-training run: its model, loss, parameters, batches and FLOPs.

  Attributes:
    kind: one of KINDS.
    model_config: the encoder's hyperparameters (ELECTRA: the
      discriminator's).
    heads: the `Albert` heads whose parameters a checkpoint holds (ELECTRA:
      the discriminator's "rtd"; `electra.part` gives the generator).
    model: the module trained: `albert.Albert` or `electra.Electra`.
    objective: its loss (`objectives.Objective`).
    batch_size: rows per step, all hosts together.
    seq_len: tokens per row.
    num_predictions: masked slots per row; 0 for the unmasked token stream
      of a causal LM.
    generator_config: ELECTRA's generator, else None.
    max_per_row: K, instances packed into a row (`config.data.pack`); 0
      for one instance per row.
  """
  kind: str
  model_config: ModelConfig
  heads: tuple[str, ...]
  model: nn.Module
  objective: objectives.Objective
  batch_size: int
  seq_len: int
  num_predictions: int
  generator_config: ModelConfig | None = None
  max_per_row: int = 0

  @property
  def masked(self) -> bool:
    """Whether the loader masks tokens (MLM-style batches)."""
    return self.num_predictions > 0

  @property
  def unigram_baseline(self) -> bool:
    """Whether the eval shows the most-frequent-target accuracy beside the
    masked-LM accuracy."""
    return self.masked

  @property
  def batch_schema(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The loader's global batch: key → (shape, dtype)."""
    return loader_lib.batch_schema(self.batch_size, self.seq_len,
                                   self.num_predictions, self.max_per_row)

  def init_params(self, rng: jax.Array) -> Any:
    """rng → boxed (logically named) parameters."""
    ids = jnp.zeros((1, self.seq_len), jnp.int32)
    slots = jnp.zeros((1, self.num_predictions), jnp.int32)
    if self.kind == "electra":
      return self.model.init({"params": rng, "sample": rng}, ids, slots,
                             slots, slots.astype(jnp.float32))["params"]
    if self.kind == "causal_lm":
      return self.model.init(rng, ids)["params"]
    return self.model.init(rng, ids, masked_positions=slots)["params"]

  def abstract_params(self) -> Any:
    """The unboxed parameters as ShapeDtypeStructs (nothing allocated)."""
    return nn.meta.unbox(jax.eval_shape(self.init_params, jax.random.key(0)))

  def forward_flops(self) -> dict[str, int]:
    """Forward FLOPs of one row by component (`model.flops`), without the
    components of heads the run does not build; ELECTRA's are prefixed
    "generator/" and "discriminator/"."""
    t = self.seq_len
    preds = min(self.num_predictions, t)
    if self.kind == "electra":
      gen = _built(flops_lib.forward_flops_breakdown(
          self.generator_config, t, preds, pooler=False, heads=("mlm",)),
                   ("mlm",))
      dis = _built(flops_lib.forward_flops_breakdown(
          self.model_config, t, 0, pooler=False, heads=("rtd",)), ("rtd",))
      return ({f"generator/{k}": v for k, v in gen.items()}
              | {f"discriminator/{k}": v for k, v in dis.items()})
    # A causal model decodes every position with its "lm" head.
    return _built(flops_lib.forward_flops_breakdown(
        self.model_config, t, None if self.kind == "causal_lm" else preds,
        heads=self.heads), self.heads, pooler=True)

  @property
  def flops_per_step(self) -> int:
    """Analytic training FLOPs of one global batch (3 × forward)."""
    return flops_lib.TRAINING_MULTIPLIER * self.batch_size * sum(
        self.forward_flops().values())


def _built(parts: dict[str, int], heads: tuple[str, ...],
           pooler: bool = False) -> dict[str, int]:
  """`parts` without the components of a pooler or heads that do not run."""
  skip = set() if pooler else {"pooler"}
  if "sop" not in heads:
    skip.add("sop")
  if "mlm" not in heads:
    skip |= {"mlm_transform", "mlm_decoder"}
  if "rtd" not in heads:
    skip.add("rtd")
  return {k: v for k, v in parts.items() if k not in skip}


def _as_config(config) -> ml_collections.ConfigDict:
  """A run's config as a ConfigDict (also from WORKDIR/config.json's dict)."""
  if isinstance(config, ml_collections.ConfigDict):
    return config
  if isinstance(config, Mapping):
    return ml_collections.ConfigDict(dict(config))
  raise TypeError(f"Expected a config, got {type(config).__name__}.")


def run_spec(config, model_config: ModelConfig | None = None, *,
             batch_size: int | None = None, seq_len: int | None = None,
             num_predictions: int | None = None) -> RunSpec:
  """The `RunSpec` of a pre-training config (a ConfigDict, or the dict a
  workdir's config.json holds).

  Args:
    config: the run's config.
    model_config: replaces `config.model` (e.g. a 16-bit stand-in dtype).
    batch_size, seq_len, num_predictions: replace the config's
      `batch_size`, `data.max_seq_length` and `masking.max_predictions`
      (e.g. one sequence for a FLOPs table).

  Raises:
    ValueError: the config does not describe a valid run.
  """
  config = _as_config(config)
  name = kind(config)
  cfg = model_config or ModelConfig.from_dict(config.model)
  batch = config.batch_size if batch_size is None else batch_size
  seq = config.data.max_seq_length if seq_len is None else seq_len
  preds = (config.masking.max_predictions if num_predictions is None
           else num_predictions)
  common = dict(model_config=cfg, batch_size=batch, seq_len=seq)
  pack = check_pack(config)
  if name == "electra":
    options = electra_lib.ElectraOptions.from_config(config.get("electra"))
    generator = electra_model.generator_config(cfg,
                                               options.generator_fraction)
    model = electra_model.Electra(cfg, generator)
    return RunSpec(kind=name, heads=("rtd",), model=model,
                   objective=electra_lib.ElectraObjective(model, options),
                   num_predictions=preds, generator_config=generator,
                   **common)
  if name == "causal_lm":
    _check_causal(config, cfg)
    model = albert_lib.Albert(cfg, heads=("lm",))
    return RunSpec(kind=name, heads=("lm",), model=model,
                   objective=objectives.CausalLMObjective(
                       model, right_padded=True),
                   num_predictions=0, **common)
  heads = sentence_heads(config.data.objective)
  model = albert_lib.Albert(cfg, heads=heads)
  if pack:
    if num_predictions is None:
      preds = masking_lib.packed_predictions(
          pipeline.masking_config(config.masking), seq, pack)
    return RunSpec(kind=name, heads=heads, model=model,
                   objective=objectives.MaskedLMObjective(model, packed=True),
                   num_predictions=preds, max_per_row=pack, **common)
  # The loader writes one instance per row, then padding
  # (data/loader.py), which lets attention take row lengths.
  return RunSpec(kind=name, heads=heads, model=model,
                 objective=objectives.MaskedLMObjective(model,
                                                        right_padded=True),
                 num_predictions=preds, **common)


def check_pack(config) -> int:
  """`config.data.pack` (K instances per row, 0 = off), refused where the
  objective cannot read packed rows.

  Raises:
    ValueError: one line, the reason and the fix.
  """
  config = _as_config(config)
  pack = config.data.pack
  if not pack:
    return 0
  name = kind(config)
  if name == "electra":
    raise ValueError(
        "config.data.pack packs several instances per row, but ELECTRA's "
        "generator samples replacements and the discriminator scores rows "
        "without per-instance positions; set --config.data.pack=0.")
  if name == "causal_lm":
    raise ValueError(
        "config.data.pack packs sentence-pair instances, but causal_lm "
        "reads contiguous windows (data.objective=none) that already fill "
        "their rows; set --config.data.pack=0.")
  return pack


def _check_causal(config, cfg: ModelConfig) -> None:
  if not cfg.causal:
    raise ValueError(
        "config.pretraining='causal_lm' predicts each next token, which a "
        "bidirectional model sees; set --config.model.causal=True.")
  if config.data.objective != "none":
    raise ValueError(
        f"config.pretraining='causal_lm' reads contiguous text, but "
        f"config.data.objective={config.data.objective!r} builds sentence "
        "pairs that are out of order half of the time; set "
        "--config.data.objective=none.")
