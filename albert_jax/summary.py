r"""Parameters per module and training FLOPs of a config, without allocating.

ALBERT's point is that stored parameters and compute come apart: the shared
layer of xxlarge is stored once but runs 12 times. This tool shows both
sides, counting parameters from the real `Albert` module (so the table can
never drift from the code) through `jax.eval_shape`, which traces shapes
only: even xxlarge is summarised instantly with no memory.

  python -m albert_jax.summary --config=configs/albert_base.py
  python -m albert_jax.summary --config=configs/albert_base.py:version=1 \
      --config.model.num_hidden_layers=24 --seq_len=128 --num_predictions=20
"""

from __future__ import annotations

import dataclasses
import math

from absl import app
from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
from ml_collections import config_flags

from albert_jax import flops
from albert_jax.model_config import ModelConfig
from albert_jax.models import Albert
from albert_jax.models import HEADS

ENCODER_TOTAL = "encoder model (incl. pooler)"
FULL_TOTAL = "with pre-training heads"
# Display order; parameters under any other path still get a row (after
# these) so that the totals stay right when the model grows.
_ORDER = ("embeddings/word_embeddings", "embeddings/position_embeddings",
          "embeddings/token_type_embeddings", "embeddings/layer_norm",
          "encoder/embedding_hidden_mapping_in", "encoder/attention",
          "encoder/ffn", "pooler", "mlm", "sop")
_HEADS = frozenset(HEADS)


@dataclasses.dataclass(frozen=True)
class Row:
  """One line of the parameter table.

  Attributes:
    name: module path, or a total's name.
    params: number of scalars.
    note: shapes, copies, or what is excluded.
    section: "encoder", "heads" or "total".
  """
  name: str
  params: int
  note: str = ""
  section: str = "encoder"


def abstract_params(cfg: ModelConfig, pooler: bool = True,
                    heads: tuple[str, ...] = HEADS) -> dict[str, jax.Array]:
  """{"a/b/c": ShapeDtypeStruct} of `Albert(cfg, pooler, heads)`'s params.

  Shapes only: the key and inputs are created inside the trace, so nothing
  is allocated on any device.
  """
  model = Albert(cfg, pooler=pooler, heads=heads)
  def init():
    return model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
  params = nn.meta.unbox(jax.eval_shape(init)["params"])
  flat = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    flat["/".join(k.key for k in path)] = leaf
  return flat


def _group(path: str) -> str:
  parts = path.split("/")
  return "/".join(parts[:2] if parts[0] in ("embeddings", "encoder")
                  else parts[:1])


def _note(cfg: ModelConfig, group: str, leaves: dict) -> str:
  """Why a row has the size it has."""
  if group.endswith("_embeddings"):
    shape = "×".join(str(d) for d in leaves[group + "/embedding"].shape)
    tied = ", tied to the MLM decoder" if group.startswith(
        "embeddings/word") else ""
    return f"[{shape}]{tied}"
  if group == "encoder/embedding_hidden_mapping_in":
    return f"E→H {cfg.embedding_size}→{cfg.hidden_size}"
  if group in ("encoder/attention", "encoder/ffn"):
    copies = next(iter(leaves.values())).shape[0]
    per_copy = sum(math.prod(x.shape) for x in leaves.values()) // copies
    return (f"{copies} stored cop{'y' if copies == 1 else 'ies'} × "
            f"{per_copy:,}, {cfg.num_steps} applied layers")
  if group == "mlm":
    return "transform, LN, output bias; decoder = word table (above)"
  return ""


def summarize(cfg: ModelConfig) -> list[Row]:
  """Parameter rows of the pre-training model, then the two totals.

  Returns:
    The "encoder" section's rows, then the `ENCODER_TOTAL` row (embeddings,
    encoder and pooler: HF's AlbertModel / BertModel), then the "heads"
    rows and the `FULL_TOTAL` row (encoder total plus the heads; the MLM
    decoder reuses the word table, so it adds only its transform and bias).
  """
  groups: dict[str, dict] = {}
  for path, leaf in abstract_params(cfg).items():
    groups.setdefault(_group(path), {})[path] = leaf
  names = [g for g in _ORDER if g in groups]
  names += sorted(set(groups) - set(names))
  rows = []
  for name in names:
    leaves = groups[name]
    section = "heads" if name.split("/")[0] in _HEADS else "encoder"
    rows.append(Row(name, sum(math.prod(x.shape) for x in leaves.values()),
                    _note(cfg, name, leaves), section))
  encoder = [r for r in rows if r.section == "encoder"]
  heads = [r for r in rows if r.section == "heads"]
  encoder_total = sum(r.params for r in encoder)
  return (encoder + [Row(ENCODER_TOTAL, encoder_total, section="total")]
          + heads + [Row(FULL_TOTAL, encoder_total + sum(
              r.params for r in heads), section="total")])


def format_table(rows: list[Row]) -> str:
  """Aligned text table; totals get a rule above them. Thousands use ","."""
  width = max(len(r.name) for r in rows)
  num = max(len(f"{r.params:,}") for r in rows)
  lines = [f"{'module':<{width}}  {'params':>{num}}  note"]
  for row in rows:
    if row.section == "total":
      lines.append("-" * (width + num + 2))
    lines.append(f"{row.name:<{width}}  {row.params:>{num},}  {row.note}"
                 .rstrip())
  return "\n".join(lines)


def _si(x: float) -> str:
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6),
                      ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.3f} {unit}"
  return f"{x:.0f} "


def format_flops(cfg: ModelConfig, seq_len: int,
                 num_predictions: int | None) -> str:
  """Training FLOPs per token and per sequence, by component (flops.py)."""
  parts = flops.forward_flops_breakdown(cfg, seq_len, num_predictions)
  mult = flops.TRAINING_MULTIPLIER
  decoded = ("all positions" if num_predictions is None
             else f"{num_predictions} masked positions")
  width = max(len(k) for k in parts)
  lines = [f"Training FLOPs (3 × forward), seq_len={seq_len}, MLM decoded at "
           f"{decoded}, {cfg.num_steps} applied layers:",
           f"{'component':<{width}}  {'per token':>13}  {'per sequence':>13}"]
  for name, fwd in list(parts.items()) + [("total", sum(parts.values()))]:
    if name == "total":
      lines.append("-" * (width + 30))
    lines.append(f"{name:<{width}}  {_si(mult * fwd / seq_len) + 'FLOP':>13}"
                 f"  {_si(mult * fwd) + 'FLOP':>13}")
  total = mult * sum(parts.values())
  lines.append(f"training FLOPs per sequence: {total:,}; per token: "
               f"{total / seq_len:,.0f}")
  return "\n".join(lines)


_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/albert_base.py[:version=1].",
    lock_config=True)
_SEQ_LEN = flags.DEFINE_integer(
    "seq_len", None, "Tokens per sequence for the FLOPs; default: the "
    "model's max_position_embeddings (512 for every release).")
_NUM_PREDICTIONS = flags.DEFINE_integer(
    "num_predictions", 20, "Masked positions decoded by the MLM head per "
    "sequence; 0 decodes every position (no masked_positions).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. "
                         "--config=configs/albert_base.py")
  try:
    cfg = ModelConfig.from_dict(config.model)
  except ValueError as e:  # a bad override: say so without a traceback
    raise app.UsageError(str(e)) from e
  seq_len = _SEQ_LEN.value or cfg.max_position_embeddings
  if not 1 <= seq_len <= cfg.max_position_embeddings:
    raise app.UsageError(f"--seq_len={seq_len} must be in [1, "
                         f"max_position_embeddings="
                         f"{cfg.max_position_embeddings}].")
  num_predictions = _NUM_PREDICTIONS.value or None
  if num_predictions is not None and not 0 < num_predictions <= seq_len:
    raise app.UsageError(f"--num_predictions={num_predictions} must be in "
                         f"[0, seq_len={seq_len}].")
  print(f"share={cfg.share}, layers={cfg.num_hidden_layers}, "
        f"groups={cfg.num_hidden_groups}, inner={cfg.inner_group_num}, "
        f"V={cfg.vocab_size}, E={cfg.embedding_size}, H={cfg.hidden_size}, "
        f"heads={cfg.num_attention_heads}, FFN={cfg.intermediate_size}")
  print()
  print(format_table(summarize(cfg)))
  print()
  print(format_flops(cfg, seq_len, num_predictions))


if __name__ == "__main__":
  app.run(main)
