"""Training FLOPs of a run's config by component, as the trainer counts them.

The per-component split of `flops.forward_flops_breakdown` for the model
`config.pretraining` trains (ELECTRA: generator and discriminator), and the
total from `pretraining.setup(config).flops_per_step` itself, for one
sequence of a chosen length. `albert_jax.summary` prints them.
"""

from __future__ import annotations

from albert_jax import electra_config
from albert_jax import flops
from albert_jax import pretraining
from albert_jax.model_config import ModelConfig


def generator_of(config, cfg: ModelConfig) -> ModelConfig | None:
  """The ELECTRA generator's config of `config`'s run (discriminator
  `cfg`), or None for a run without one."""
  if pretraining.kind(config) != "electra":
    return None
  fraction = electra_config.ElectraOptions.from_config(
      config).generator_fraction
  return electra_config.generator_config(cfg, fraction)


def one_sequence(config, seq_len: int, num_predictions: int | None):
  """A copy of `config` whose run is one `seq_len`-token sequence with
  `num_predictions` masked slots (None: one per token)."""
  one = config.copy_and_resolve_references()
  one.batch_size = 1
  one.data.max_seq_length = seq_len
  one.masking.max_predictions = (
      seq_len if num_predictions is None else num_predictions)
  return one


def _si(x: float) -> str:
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6),
                      ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.3f} {unit}"
  return f"{x:.0f} "


def _built(parts: dict[str, int], pooler: bool, heads: tuple[str, ...]
           ) -> dict[str, int]:
  """`parts` without the components of a pooler or heads that do not run."""
  skip = set() if pooler else {"pooler"}
  if "sop" not in heads:
    skip.add("sop")
  if "mlm" not in heads:
    skip |= {"mlm_transform", "mlm_decoder"}
  return {k: v for k, v in parts.items() if k not in skip}


def flops_breakdown(config, cfg: ModelConfig, seq_len: int,
                    num_predictions: int | None) -> dict[str, int]:
  """Forward FLOPs of one sequence of `config`'s run, by component.

  Args:
    config: the run's config; `config.pretraining` picks the model.
    cfg: its model section as a ModelConfig.
    seq_len: tokens per sequence.
    num_predictions: masked positions the MLM head decodes (None: all);
      a causal model decodes every position whatever it is.

  Returns:
    Component → FLOPs (see `flops.forward_flops_breakdown`), without those
    of heads the run does not build; ELECTRA's are prefixed "generator/"
    and "discriminator/".
  """
  kind = pretraining.kind(config)
  if kind == "electra":
    generator = generator_of(config, cfg)
    gen = flops.forward_flops_breakdown(generator, seq_len, num_predictions,
                                        pooler=False, heads=("mlm",))
    dis = flops.forward_flops_breakdown(cfg, seq_len, 0, pooler=False,
                                        heads=())
    dis["rtd"] = electra_config.rtd_head_flops(cfg, seq_len)
    return ({f"generator/{k}": v
             for k, v in _built(gen, False, ("mlm",)).items()}
            | {f"discriminator/{k}": v
               for k, v in _built(dis, False, ("rtd",)).items()})
  heads = pretraining.checkpoint_heads(config)
  if kind == "causal_lm":
    num_predictions = None
  return _built(flops.forward_flops_breakdown(
      cfg, seq_len, num_predictions, heads=heads), True, heads)


def training_flops_per_sequence(config, cfg: ModelConfig, seq_len: int,
                                num_predictions: int | None) -> int:
  """Training FLOPs of one sequence as the trainer counts them: the
  `pretraining.setup(...).flops_per_step` of `config` with a batch of one
  `seq_len`-token sequence and `num_predictions` masked slots (None: one
  per token)."""
  return pretraining.setup(one_sequence(config, seq_len, num_predictions),
                           cfg).flops_per_step


def format_flops(config, cfg: ModelConfig, seq_len: int,
                 num_predictions: int | None) -> str:
  """Training FLOPs per token and per sequence, by component (flops.py);
  the last line is `training_flops_per_sequence`."""
  parts = flops_breakdown(config, cfg, seq_len, num_predictions)
  mult = flops.TRAINING_MULTIPLIER
  kind = pretraining.kind(config)
  decoded = ("all positions" if num_predictions is None
             else f"{num_predictions} masked positions")
  if kind == "causal_lm":
    decoded = "LM decoded at all positions, causal attention"
  elif kind == "electra":
    decoded = f"generator's MLM decoded at {decoded}, RTD at every token"
  else:
    decoded = f"MLM decoded at {decoded}"
  layers = f"{cfg.num_steps} applied layers" + (
      " each" if kind == "electra" else "")
  width = max(len(k) for k in parts)
  lines = [f"Training FLOPs (3 × forward), seq_len={seq_len}, {decoded}, "
           f"{layers}:",
           f"{'component':<{width}}  {'per token':>13}  {'per sequence':>13}"]
  for name, fwd in list(parts.items()) + [("total", sum(parts.values()))]:
    if name == "total":
      lines.append("-" * (width + 30))
    lines.append(f"{name:<{width}}  {_si(mult * fwd / seq_len) + 'FLOP':>13}"
                 f"  {_si(mult * fwd) + 'FLOP':>13}")
  total = training_flops_per_sequence(config, cfg, seq_len, num_predictions)
  lines.append(f"training FLOPs per sequence: {total:,}; per token: "
               f"{total / seq_len:,.0f}")
  return "\n".join(lines)
