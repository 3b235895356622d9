r"""Parameters per module and training FLOPs of a run, without allocating.

ALBERT's point is that stored parameters and compute come apart: the shared
layer of xxlarge is stored once but runs 12 times. This tool shows both
sides for the model a config's run trains (`run_spec.run_spec`): ALBERT,
BERT and RoBERTa with their MLM (and sentence) heads, GPT-1 with its "lm"
head, ELECTRA's discriminator with its "rtd" head and its generator as rows
of their own. Parameters are counted from the run's real initialiser
through `jax.eval_shape`, which traces shapes only (so the table can never
drift from the code, and even xxlarge is summarised instantly with no
memory); the training FLOPs are the ones the trainer's MFU uses.

  python -m albert_jax.tools.summary --config=configs/albert_base.py
  python -m albert_jax.tools.summary --config=configs/albert_base.py:version=1 \
      --config.model.num_hidden_layers=24 --seq_len=128 --num_predictions=20
  python -m albert_jax.tools.summary --config=configs/electra_small.py
"""

from __future__ import annotations

import dataclasses
import math

from absl import app
from absl import flags
from ml_collections import config_flags

from albert_jax import tree as tree_lib
from albert_jax.model import albert as albert_lib
from albert_jax.model import flops as flops_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import defaults
from albert_jax.training import run_spec

ENCODER_TOTAL = "encoder model (incl. pooler)"
# ELECTRA's discriminator has no pooler (HF's ElectraModel).
BARE_ENCODER_TOTAL = "encoder model (no pooler)"
FULL_TOTAL = "with pre-training heads"
DISCRIMINATOR_TOTAL = "discriminator (with rtd head)"
GENERATOR_TOTAL = "generator (with the shared embeddings)"
ELECTRA_TOTAL = "generator + discriminator"
# Display order; parameters under any other path still get a row (after
# these) so that the totals stay right when the model grows.
_ORDER = ("embeddings/word_embeddings", "embeddings/position_embeddings",
          "embeddings/token_type_embeddings", "embeddings/layer_norm",
          "encoder/embedding_hidden_mapping_in", "encoder/attention",
          "encoder/ffn", "pooler", "mlm", "sop", "rtd", "lm",
          "generator_encoder/embedding_hidden_mapping_in",
          "generator_encoder/attention", "generator_encoder/ffn",
          "generator_mlm")
_HEADS = frozenset(albert_lib.ALL_HEADS)
# ELECTRA's generator: everything under these names (see electra.Electra).
_GENERATOR = "generator_"


@dataclasses.dataclass(frozen=True)
class Row:
  """One line of the parameter table.

  Attributes:
    name: module path, or a total's name.
    params: number of scalars.
    note: shapes, copies, or what is excluded.
    section: "encoder", "heads", "generator" (ELECTRA's) or "total".
  """
  name: str
  params: int
  note: str = ""
  section: str = "encoder"


def default_heads(cfg: ModelConfig) -> tuple[str, ...]:
  """The pre-training heads of `cfg` when no run says otherwise: the
  next-token "lm" head for a causal model, else ALBERT's mlm + sop."""
  return ("lm",) if cfg.causal else albert_lib.HEADS


def one_sequence(config, cfg: ModelConfig | None = None, seq_len: int = 1,
                 num_predictions: int = 1) -> run_spec.RunSpec:
  """`config`'s run with a batch of one `seq_len`-token sequence and
  `num_predictions` masked slots (no parameter depends on them)."""
  return run_spec.run_spec(config, cfg, batch_size=1, seq_len=seq_len,
                           num_predictions=num_predictions)


def _group(path: str) -> str:
  parts = path.split("/")
  return "/".join(parts[:2] if parts[0] in (
      "embeddings", "encoder", _GENERATOR + "encoder") else parts[:1])


def _section(group: str) -> str:
  top = group.split("/")[0]
  if top.startswith(_GENERATOR):
    return "generator"
  return "heads" if top in _HEADS else "encoder"


def _note(cfg: ModelConfig, group: str, leaves: dict, tie: str) -> str:
  """Why a row has the size it has. `tie` names the decoder that reuses the
  word table ("" for none)."""
  # The generator's rows read like the discriminator's, with its own sizes.
  key = group.removeprefix(_GENERATOR)
  if group.endswith("_embeddings"):
    shape = "×".join(str(d) for d in leaves[group + "/embedding"].shape)
    tied = f", {tie}" if tie and group.startswith("embeddings/word") else ""
    return f"[{shape}]{tied}"
  if key == "encoder/embedding_hidden_mapping_in":
    return f"E→H {cfg.embedding_size}→{cfg.hidden_size}"
  if key in ("encoder/attention", "encoder/ffn"):
    copies = next(iter(leaves.values())).shape[0]
    per_copy = sum(math.prod(x.shape) for x in leaves.values()) // copies
    return (f"{copies} stored cop{'y' if copies == 1 else 'ies'} × "
            f"{per_copy:,}, {cfg.num_steps} applied layers")
  if key == "mlm":
    return "transform, LN, output bias; decoder = word table (above)"
  if group == "rtd":
    return f"dense H→H {cfg.hidden_size}→{cfg.hidden_size}, then H→1"
  if group == "lm":
    if leaves:
      return (f"transform H→E {cfg.hidden_size}→{cfg.embedding_size}; "
              "decoder = word table (above)")
    return "decoder = word table (above), no parameters of its own"
  return ""


def _tie(groups: dict, heads: tuple[str, ...]) -> str:
  if "mlm" in groups:
    return "tied to the MLM decoder"
  if _GENERATOR + "mlm" in groups:
    return "shared by both; tied to the generator's MLM decoder"
  if "lm" in heads:
    return "tied to the LM decoder"
  return ""


def _rows(flat: dict, cfg: ModelConfig, heads: tuple[str, ...],
          generator: ModelConfig | None) -> list[Row]:
  """Rows and totals of a flat parameter tree (see `summarize`)."""
  groups: dict[str, dict] = {}
  for path, leaf in flat.items():
    groups.setdefault(_group(path), {})[path] = leaf
  tie = _tie(groups, heads)
  for head in heads:  # a head without parameters still shows that it runs
    groups.setdefault(head, {})
  names = [g for g in _ORDER if g in groups]
  names += sorted(set(groups) - set(names))
  rows = []
  for name in names:
    leaves, section = groups[name], _section(name)
    own = generator if section == "generator" else cfg
    rows.append(Row(name, sum(math.prod(x.shape) for x in leaves.values()),
                    _note(own, name, leaves, tie), section))
  part = {s: [r for r in rows if r.section == s]
          for s in ("encoder", "heads", "generator")}
  encoder_total = sum(r.params for r in part["encoder"])
  with_heads = encoder_total + sum(r.params for r in part["heads"])
  out = part["encoder"] + [
      Row(ENCODER_TOTAL if "pooler" in groups else BARE_ENCODER_TOTAL,
          encoder_total, section="total")] + part["heads"]
  if not part["generator"]:
    return out + [Row(FULL_TOTAL, with_heads, section="total")]
  embeddings = sum(r.params for r in part["encoder"]
                   if r.name.startswith("embeddings/"))
  own = sum(r.params for r in part["generator"])
  return out + [
      Row(DISCRIMINATOR_TOTAL, with_heads, "HF's ElectraForPreTraining",
          "total")] + part["generator"] + [
              Row(GENERATOR_TOTAL, embeddings + own,
                  "embeddings + the generator rows; HF's ElectraForMaskedLM",
                  "total"),
              Row(ELECTRA_TOTAL, with_heads + own,
                  "what the run stores: the embeddings once", "total")]


def summarize(cfg: ModelConfig, heads: tuple[str, ...] | None = None,
              pooler: bool = True) -> list[Row]:
  """Parameter rows of `Albert(cfg, pooler, heads)`, then the two totals.

  Args:
    cfg: the model's hyperparameters.
    heads: the pre-training heads (default `default_heads(cfg)`).
    pooler: whether the model has its pooler.

  Returns:
    The "encoder" section's rows, then the `ENCODER_TOTAL` row (embeddings,
    encoder and pooler: HF's AlbertModel / BertModel; `BARE_ENCODER_TOTAL`
    without a pooler), then the "heads" rows and the `FULL_TOTAL` row
    (encoder total plus the heads; the MLM and LM decoders reuse the word
    table, so they add only their transform and bias).
  """
  heads = default_heads(cfg) if heads is None else tuple(heads)
  flat = tree_lib.flatten(albert_lib.abstract_params(cfg, pooler, heads))
  return _rows(flat, cfg, heads, None)


def summarize_run(config, cfg: ModelConfig | None = None) -> list[Row]:
  """Parameter rows of the model `config`'s run trains (its `RunSpec`).

  As `summarize` for masked and causal LM runs, with the heads the run's
  checkpoints hold. For ELECTRA: the discriminator's rows (shared
  embeddings, encoder, no pooler) and their `BARE_ENCODER_TOTAL`, the "rtd"
  head and `DISCRIMINATOR_TOTAL`, then the "generator" section (its encoder
  and MLM head), `GENERATOR_TOTAL` (with the shared embeddings) and
  `ELECTRA_TOTAL` (both, embeddings once).

  Args:
    config: the run's config (a ConfigDict, as the trainer reads it).
    cfg: replaces `config.model` (default: built from it).

  Raises:
    ValueError: the config does not describe a valid run.
  """
  spec = one_sequence(config, cfg)
  return _rows(tree_lib.flatten(spec.abstract_params()), spec.model_config,
               spec.heads, spec.generator_config)


def _si(x: float) -> str:
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6),
                      ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.3f} {unit}"
  return f"{x:.0f} "


def format_flops(config, cfg: ModelConfig, seq_len: int,
                 num_predictions: int | None) -> str:
  """Training FLOPs per token and per sequence, by component
  (`RunSpec.forward_flops`); the last line is the trainer's count for one
  sequence (`RunSpec.flops_per_step` of a batch of one). `num_predictions`
  None decodes every position."""
  spec = one_sequence(config, cfg, seq_len,
                      seq_len if num_predictions is None else num_predictions)
  parts = spec.forward_flops()
  mult = flops_lib.TRAINING_MULTIPLIER
  decoded = ("all positions" if num_predictions is None
             else f"{num_predictions} masked positions")
  if spec.kind == "causal_lm":
    decoded = "LM decoded at all positions, causal attention"
  elif spec.kind == "electra":
    decoded = f"generator's MLM decoded at {decoded}, RTD at every token"
  else:
    decoded = f"MLM decoded at {decoded}"
  layers = f"{spec.model_config.num_steps} applied layers" + (
      " each" if spec.kind == "electra" else "")
  width = max(len(k) for k in parts)
  lines = [f"Training FLOPs (3 × forward), seq_len={seq_len}, {decoded}, "
           f"{layers}:",
           f"{'component':<{width}}  {'per token':>13}  {'per sequence':>13}"]
  for name, fwd in list(parts.items()) + [("total", sum(parts.values()))]:
    if name == "total":
      lines.append("-" * (width + 30))
    lines.append(f"{name:<{width}}  {_si(mult * fwd / seq_len) + 'FLOP':>13}"
                 f"  {_si(mult * fwd) + 'FLOP':>13}")
  total = spec.flops_per_step
  lines.append(f"training FLOPs per sequence: {total:,}; per token: "
               f"{total / seq_len:,.0f}")
  return "\n".join(lines)


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


def format_model(config, cfg: ModelConfig) -> str:
  """The headline: the run's objective (when not masked LM) and shapes."""
  kind = run_spec.kind(config)
  lines = ([] if kind == defaults.PRETRAINING["pretraining"]
           else [f"pretraining={kind}"])
  lines.append(
      f"share={cfg.share}, layers={cfg.num_hidden_layers}, "
      f"groups={cfg.num_hidden_groups}, inner={cfg.inner_group_num}, "
      f"V={cfg.vocab_size}, E={cfg.embedding_size}, H={cfg.hidden_size}, "
      f"heads={cfg.num_attention_heads}, FFN={cfg.intermediate_size}"
      + (", causal" if cfg.causal else ""))
  generator = one_sequence(config, cfg).generator_config
  if generator is not None:
    lines.append(
        f"generator: H={generator.hidden_size}, "
        f"heads={generator.num_attention_heads}, "
        f"FFN={generator.intermediate_size}, same depth, embeddings shared")
  return "\n".join(lines)


_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/albert_base.py[:version=1].",
    lock_config=True)
_SEQ_LEN = flags.DEFINE_integer(
    "seq_len", None, "Tokens per sequence for the FLOPs; default: the "
    "model's longest sequence, ModelConfig.max_length (512 for every "
    "release; RoBERTa's 514 positions hold 512 tokens).")
_NUM_PREDICTIONS = flags.DEFINE_integer(
    "num_predictions", 20, "Masked positions decoded by the MLM head per "
    "sequence; 0 decodes every position (no masked_positions). A causal "
    "model decodes every position whatever it is.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. "
                         "--config=configs/albert_base.py")
  try:
    cfg = ModelConfig.from_dict(config.model)
    kind = run_spec.kind(config)
  except ValueError as e:  # a bad override: say so without a traceback
    raise app.UsageError(str(e)) from e
  seq_len = _SEQ_LEN.value or cfg.max_length
  if not 1 <= seq_len <= cfg.max_length:
    raise app.UsageError(f"--seq_len={seq_len} must be in [1, "
                         f"{cfg.max_length}], the model's longest sequence.")
  num_predictions = _NUM_PREDICTIONS.value or None
  if kind == "causal_lm":
    num_predictions = None
  elif num_predictions is not None and not 0 < num_predictions <= seq_len:
    raise app.UsageError(f"--num_predictions={num_predictions} must be in "
                         f"[0, seq_len={seq_len}].")
  try:
    rows = summarize_run(config, cfg)
    text = format_flops(config, cfg, seq_len, num_predictions)
  except ValueError as e:  # e.g. a head or objective the model cannot train
    raise app.UsageError(str(e)) from e
  print(format_model(config, cfg))
  print()
  print(format_table(rows))
  print()
  print(text)


if __name__ == "__main__":
  app.run(main)
