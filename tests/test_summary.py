"""flops.py against hand arithmetic and the model's own matmuls; summary.py's
table against the published parameter counts, in process and as a CLI."""

import importlib.util
import math
import os
import pathlib
import subprocess
import sys

import hypothesis
from hypothesis import strategies as st
import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import pytest

from albert_jax import Albert
from albert_jax import ModelConfig
from albert_jax import config_lib
from albert_jax import flops
from albert_jax import summary

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_config(name, arg=None):
  spec = importlib.util.spec_from_file_location(
      f"configs_{name}", ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return ModelConfig.from_dict(module.get_config(arg).model)


# ----------------------------------------------------------------- FLOPs


def test_flops_by_hand_for_tiny():
  # tiny: V=1000, E=32, H=64, 2 layers (inner 1), F=128, 2 labels.
  cfg = load_config("tiny")
  t, p = 16, 3
  want = {
      "embedding_projection": 2 * 16 * 32 * 64,          # 65,536
      "attention_projections": 2 * 16 * 4 * 2 * 64 * 64,  # 1,048,576
      "attention_scores": 2 * 16 * 4 * 16 * 64,         # 131,072
      "ffn": 2 * 16 * 2 * 2 * 64 * 128,                 # 1,048,576
      "pooler": 2 * 64 * 64,                            # 8,192
      "sop": 2 * 64 * 2,                                # 256
      "mlm_transform": 3 * 2 * 64 * 32,                 # 12,288
      "mlm_decoder": 3 * 2 * 32 * 1000,                 # 192,000
  }
  assert flops.forward_flops_breakdown(cfg, t, p) == want
  assert flops.forward_flops_per_sequence(cfg, t, p) == 2_506_496
  assert flops.forward_flops_per_token(cfg, t, p) == 2_506_496 / 16
  assert flops.training_flops_per_token(cfg, t, p) == 3 * 156_656
  assert flops.training_flops_per_step(cfg, 8, t, p) == 3 * 8 * 2_506_496
  # Without masked positions the head decodes all 16 tokens.
  every = flops.forward_flops_breakdown(cfg, t)
  assert every["mlm_transform"] == 16 * 2 * 64 * 32
  assert every["mlm_decoder"] == 16 * 2 * 32 * 1000
  # Fine-tuning: encoder and pooler only.
  encoder = flops.forward_flops_per_sequence(cfg, t, heads=())
  assert encoder == 2_506_496 - 256 - 12_288 - 192_000


def test_flops_sharing_saves_params_not_compute():
  shared = load_config("albert_base")
  unshared = ModelConfig.from_dict({**shared.to_dict(), "share": "none"})
  assert (flops.forward_flops_per_sequence(shared, 512, 20)
          == flops.forward_flops_per_sequence(unshared, 512, 20))
  # Each layer running its group's two blocks doubles the encoder's work.
  inner = ModelConfig.from_dict({**shared.to_dict(), "inner_group_num": 2})
  one = flops.forward_flops_breakdown(shared, 512, 20)
  two = flops.forward_flops_breakdown(inner, 512, 20)
  for name in ("attention_projections", "attention_scores", "ffn"):
    assert two[name] == 2 * one[name]


def test_flops_refuse_bad_arguments():
  cfg = load_config("tiny")
  with pytest.raises(ValueError, match="num_predictions"):
    flops.forward_flops_per_sequence(cfg, 16, 17)
  with pytest.raises(ValueError, match="seq_len"):
    flops.forward_flops_per_sequence(cfg, 0)
  with pytest.raises(ValueError, match="Unknown heads"):
    flops.forward_flops_per_sequence(cfg, 16, heads=("nsp",))
  assert flops.mfu(2e12, 2.0, 4e12) == 0.25


def _sub_jaxprs(value):
  if isinstance(value, jax_core.ClosedJaxpr):
    return [value.jaxpr]
  if isinstance(value, jax_core.Jaxpr):
    return [value]
  if isinstance(value, (tuple, list)):
    return [j for v in value for j in _sub_jaxprs(v)]
  return []


def _matmul_flops(jaxpr):
  """2·(output size)·(contracted size) summed over every dot_general."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += (2 * math.prod(eqn.outvars[0].aval.shape)
                * math.prod(lhs[d] for d in contract))
      continue
    subs = [j for v in eqn.params.values() for j in _sub_jaxprs(v)]
    if eqn.primitive.name == "cond":
      total += max(_matmul_flops(j) for j in subs)
    elif eqn.primitive.name == "while" and subs:
      raise NotImplementedError("a loop of unknown length")
    else:
      inner = sum(_matmul_flops(j) for j in subs)
      total += inner * eqn.params.get("length", 1)
  return total


@st.composite
def _model_and_shape(draw):
  share = draw(st.sampled_from(("all", "attention", "ffn", "none")))
  layers = draw(st.integers(1, 3))
  heads = draw(st.sampled_from(((), ("mlm",), ("mlm", "sop"))))
  hidden = draw(st.sampled_from((1, 2, 4))) * draw(st.sampled_from((4, 8)))
  projection = draw(st.booleans())
  values = dict(
      share=share, projection=projection, num_hidden_layers=layers,
      num_hidden_groups=1 if share == "none" else draw(st.integers(1, layers)),
      inner_group_num=draw(st.integers(1, 2)), hidden_size=hidden,
      num_attention_heads=draw(st.sampled_from(
          [h for h in (1, 2, 4) if hidden % h == 0])),
      intermediate_size=draw(st.integers(4, 24)),
      embedding_size=draw(st.integers(4, 12)) if projection else hidden,
      vocab_size=draw(st.integers(5, 40)),
      num_sentence_labels=draw(st.integers(2, 3)))
  cfg = ModelConfig.from_dict(config_lib.tiny_model(**values))
  seq_len = draw(st.integers(1, 6))
  predictions = draw(st.none() | st.integers(1, seq_len))
  pooler = "sop" in heads or draw(st.booleans())
  return cfg, seq_len, predictions, pooler, heads


@hypothesis.settings(max_examples=10, deadline=None, derandomize=True)
@hypothesis.given(_model_and_shape())
def test_flops_equal_the_models_matmuls(case):
  # The formula must account for every matmul the model really traces, so
  # a new projection in models.py cannot silently skew MFU.
  cfg, seq_len, predictions, pooler, heads = case
  model = Albert(cfg, pooler=pooler, heads=heads)
  ids = jnp.zeros((1, seq_len), jnp.int32)
  positions = None if predictions is None else jnp.zeros(
      (1, predictions), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))
  traced = jax.make_jaxpr(
      lambda p: model.apply(p, ids, masked_positions=positions))(params)
  assert _matmul_flops(traced.jaxpr) == flops.forward_flops_per_sequence(
      cfg, seq_len, predictions, pooler=pooler, heads=heads)


# ------------------------------------------------------------- summary


def _rows(cfg):
  return {r.name: r for r in summary.summarize(cfg)}


@pytest.mark.parametrize("name,arg", [
    ("albert_base", None), ("bert_base", None), ("tiny", "share=none"),
    ("tiny", "share=attention,layers=4,groups=2,inner=2"),
    ("tiny", "projection=false")])
def test_rows_add_up_to_totals_and_to_the_model(name, arg):
  cfg = load_config(name, arg)
  rows = summary.summarize(cfg)
  encoder = [r for r in rows if r.section == "encoder"]
  heads = [r for r in rows if r.section == "heads"]
  totals = {r.name: r.params for r in rows if r.section == "total"}
  assert [r.name for r in heads] == ["mlm", "sop"]
  assert totals[summary.ENCODER_TOTAL] == sum(r.params for r in encoder)
  assert totals[summary.FULL_TOTAL] == sum(r.params for r in encoder + heads)
  def count(**kwargs):
    return sum(math.prod(x.shape) for x in
               summary.abstract_params(cfg, **kwargs).values())
  assert totals[summary.ENCODER_TOTAL] == count(heads=())
  assert totals[summary.FULL_TOTAL] == count()


@pytest.mark.parametrize("name,encoder,mlm,sop", [
    ("albert_base", 11_683_584, 128_688, 1_538),
    ("albert_xxlarge", 222_595_584, 554_672, 8_194),
    ("bert_large", 335_141_888, None, None)])
def test_summary_reports_published_counts(name, encoder, mlm, sop):
  rows = _rows(load_config(name))
  assert rows[summary.ENCODER_TOTAL].params == encoder
  if mlm is not None:
    assert (rows["mlm"].params, rows["sop"].params) == (mlm, sop)


def test_stacks_show_copies_and_applied_layers():
  assert _rows(load_config("albert_base"))["encoder/attention"].note.startswith(
      "1 stored copy × 2,363,904, 12 applied layers")
  assert _rows(load_config("bert_base"))["encoder/ffn"].note.startswith(
      "12 stored copies × ")
  grouped = _rows(load_config("tiny", "share=ffn,layers=4,groups=2,inner=2"))
  assert grouped["encoder/ffn"].note.startswith("4 stored copies")
  assert grouped["encoder/attention"].note.startswith("8 stored copies")
  assert grouped["encoder/attention"].note.endswith("8 applied layers")
  assert "encoder/embedding_hidden_mapping_in" not in _rows(
      load_config("bert_base"))


def test_table_prints_exact_totals():
  cfg = load_config("albert_base")
  table = summary.format_table(summary.summarize(cfg))
  lines = {line.split("  ")[0].strip(): line for line in table.splitlines()}
  assert "11,683,584" in lines[summary.ENCODER_TOTAL]
  assert "11,813,810" in lines[summary.FULL_TOTAL]  # + 128,688 + 1,538
  assert "3,840,000" in lines["embeddings/word_embeddings"]
  text = summary.format_flops(cfg, 512, 20)
  assert f"{flops.training_flops_per_step(cfg, 1, 512, 20):,}" in text


# ------------------------------------------------------------------ CLI


def _cli(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
      [sys.executable, "-m", "albert_jax.summary", *args], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=120, check=False)


def test_cli_end_to_end():
  result = _cli("--config=configs/albert_base.py", "--seq_len=128")
  assert result.returncode == 0, result.stderr
  assert "11,683,584" in result.stdout
  assert "12 applied layers" in result.stdout
  cfg = load_config("albert_base")
  total = flops.training_flops_per_step(cfg, 1, 128, 20)
  assert f"training FLOPs per sequence: {total:,}" in result.stdout


def test_cli_honours_overrides():
  result = _cli("--config=configs/albert_base.py:version=1",
                "--config.model.num_hidden_layers=24")
  assert result.returncode == 0, result.stderr
  assert "24 applied layers" in result.stdout
  # Shared: 24 layers store exactly what 12 do, but cost more FLOPs.
  assert "11,683,584" in result.stdout
  cfg = ModelConfig.from_dict(
      {**load_config("albert_base", "version=1").to_dict(),
       "num_hidden_layers": 24})
  total = flops.training_flops_per_step(cfg, 1, 512, 20)
  assert f"training FLOPs per sequence: {total:,}" in result.stdout


def test_cli_refuses_unknown_override():
  result = _cli("--config=configs/albert_base.py",
                "--config.model.num_hidden_layer=24")
  assert result.returncode != 0
  assert "num_hidden_layers" in result.stderr  # the suggestion
