"""flops.py against hand arithmetic and the model's own matmuls; summary.py's
table against the published parameter counts, in process and as a CLI."""

import importlib.util
import math
import os
import subprocess
import sys

import hypothesis
from hypothesis import strategies as st
import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import pytest

from albert_jax import Albert
from albert_jax import config_lib
from albert_jax import ModelConfig
from albert_jax.model import albert as albert_lib
from albert_jax.model import flops
from albert_jax.tools import summary
from albert_jax.training import run_spec
from locations import REPO

ROOT = REPO


def load_run(name, arg=None):
  """configs/{name}.py's ConfigDict (with `:arg`)."""
  spec = importlib.util.spec_from_file_location(
      f"configs_{name}", ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def load_config(name, arg=None):
  return ModelConfig.from_dict(load_run(name, arg).model)


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
    return sum(math.prod(x.shape) for x in jax.tree.leaves(
        albert_lib.abstract_params(cfg, **kwargs)))
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
  text = summary.format_flops(load_run("albert_base"), cfg, 512, 20)
  assert f"{flops.training_flops_per_step(cfg, 1, 512, 20):,}" in text


# --------------------------------------------- the family's other runs


def _hf_count(config_cls, model_cls, **kwargs):
  """Parameters of a transformers model built on the meta device (shapes
  only; tied tensors counted once)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  with torch.device("meta"):
    model = getattr(transformers, model_cls)(
        getattr(transformers, config_cls)(**kwargs))
  return sum(p.numel() for p in model.parameters())


def test_gpt_summary_is_the_causal_lm_with_its_lm_head():
  config = load_run("gpt_small")
  rows = {r.name: r for r in summary.summarize_run(config)}
  assert [n for n, r in rows.items() if r.section == "heads"] == ["lm"]
  assert rows["lm"].params == 0  # H = E: the tied table is the decoder
  total = rows[summary.FULL_TOTAL].params
  assert total == rows[summary.ENCODER_TOTAL].params == 117_127_680
  hf = _hf_count("OpenAIGPTConfig", "OpenAIGPTLMHeadModel",
                 vocab_size=40478, n_positions=512, n_embd=768, n_layer=12,
                 n_head=12, afn="gelu")
  assert hf == 116_534_784
  # configs/gpt_small.py's differences from GPT-1: BERT's embedding
  # LayerNorm, one token-type vector, and the pooler Albert builds.
  extra = sum(rows[n].params for n in (
      "embeddings/layer_norm", "embeddings/token_type_embeddings", "pooler"))
  assert extra == 2 * 768 + 768 + (768 * 768 + 768)
  assert total == hf + extra
  # A causal ModelConfig alone (report.py's count) gets the same rows.
  assert summary.summarize(load_config("gpt_small")) == list(rows.values())


@pytest.mark.parametrize("arg,disc,gen", [
    (None, dict(embedding_size=128, hidden_size=256, num_attention_heads=4,
                intermediate_size=1024),
     dict(embedding_size=128, hidden_size=64, num_attention_heads=1,
          intermediate_size=256)),
    ("base", dict(embedding_size=768, hidden_size=768, num_attention_heads=12,
                  intermediate_size=3072),
     dict(embedding_size=768, hidden_size=256, num_attention_heads=4,
          intermediate_size=1024))])
def test_electra_summary_counts_both_parts_like_transformers(arg, disc, gen):
  config = load_run("electra_base" if arg else "electra_small")
  rows = summary.summarize_run(config)
  by_name = {r.name: r for r in rows}
  common = dict(vocab_size=30522, num_hidden_layers=12,
                max_position_embeddings=512, type_vocab_size=2)
  want_disc = _hf_count("ElectraConfig", "ElectraForPreTraining",
                        **common, **disc)
  want_gen = _hf_count("ElectraConfig", "ElectraForMaskedLM", **common, **gen)
  want_model = _hf_count("ElectraConfig", "ElectraModel", **common, **disc)
  assert by_name[summary.BARE_ENCODER_TOTAL].params == want_model
  assert by_name[summary.DISCRIMINATOR_TOTAL].params == want_disc
  assert by_name[summary.GENERATOR_TOTAL].params == want_gen
  embeddings = sum(r.params for r in rows if r.name.startswith("embeddings/"))
  both = by_name[summary.ELECTRA_TOTAL].params
  assert both == want_disc + want_gen - embeddings
  # Exactly what the trainer initialises, and nothing of ALBERT's heads.
  assert both == sum(math.prod(x.shape) for x in jax.tree.leaves(
      summary.one_sequence(config).abstract_params()))
  assert {r.name for r in rows if r.section == "heads"} == {"rtd"}
  assert [r.name for r in rows if r.section == "generator"] == [
      "generator_encoder/embedding_hidden_mapping_in",
      "generator_encoder/attention", "generator_encoder/ffn", "generator_mlm"]
  assert "pooler" not in by_name and summary.ENCODER_TOTAL not in by_name
  assert (want_disc, want_gen) == ((109_483_009, 33_740_602) if arg else
                                   (13_549_057, 4_620_026))


def test_roberta_summary_has_no_sentence_head_and_512_tokens():
  config = load_run("roberta_base")
  rows = {r.name: r for r in summary.summarize_run(config)}
  assert [n for n, r in rows.items() if r.section == "heads"] == ["mlm"]
  roberta = dict(vocab_size=50265, max_position_embeddings=514,
                 type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
  assert rows[summary.ENCODER_TOTAL].params == _hf_count(
      "RobertaConfig", "RobertaModel", **roberta) == 124_645_632
  # RobertaForMaskedLM has no pooler.
  assert (rows[summary.FULL_TOTAL].params - rows["pooler"].params
          == _hf_count("RobertaConfig", "RobertaForMaskedLM", **roberta)
          == 124_697_433)
  assert rows["mlm"].params == 642_393
  cfg = load_config("roberta_base")
  assert cfg.max_position_embeddings == 514 and cfg.max_length == 512


@pytest.mark.parametrize("name,arg,seq_len,predictions", [
    ("albert_base", None, 512, 20), ("bert_base", None, 128, None),
    ("roberta_base", None, 512, 20), ("gpt_small", None, 512, None),
    ("gpt_small", "tiny", 64, None), ("electra_small", None, 128, 20),
    ("electra_base", "tiny", 32, None)])
def test_flops_breakdown_adds_up_to_the_trainers_count(name, arg, seq_len,
                                                       predictions):
  config, cfg = load_run(name, arg), load_config(name, arg)
  spec = summary.one_sequence(config, cfg, seq_len, predictions or seq_len)
  parts, total = spec.forward_flops(), spec.flops_per_step
  assert flops.TRAINING_MULTIPLIER * sum(parts.values()) == total
  # The trainer's own Setup, on a batch of 4 of the same sequences.
  run = config.copy_and_resolve_references()
  run.batch_size = 4
  run.data.max_seq_length = seq_len
  run.masking.max_predictions = predictions or seq_len
  assert run_spec.run_spec(run).flops_per_step == 4 * total
  kind = run_spec.kind(config)
  if kind == "masked_lm":
    heads = run_spec.sentence_heads(config.data.objective)
    assert total == flops.training_flops_per_step(cfg, 1, seq_len,
                                                  predictions, heads=heads)
    assert ("sop" in parts) == ("sop" in heads)
  elif kind == "causal_lm":
    assert "mlm_decoder" not in parts and parts["lm_decoder"] == (
        seq_len * 2 * cfg.embedding_size * cfg.vocab_size)
  else:
    assert not any("pooler" in k or "sop" in k for k in parts)
    assert parts["discriminator/rtd"] == seq_len * (
        2 * cfg.hidden_size ** 2 + 2 * cfg.hidden_size)


# ------------------------------------------------------------------ CLI


def _cli(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
      [sys.executable, "-m", "albert_jax.tools.summary", *args], cwd=ROOT, env=env,
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


@pytest.mark.parametrize("config,want,refused", [
    ("gpt_small.py", ["pretraining=causal_lm", "tied to the LM decoder",
                      "LM decoded at all positions", "117,127,680"],
     ["mlm", "sop"]),
    ("electra_small.py", ["pretraining=electra", "generator: H=64",
                          "generator_mlm", "13,549,057", "4,620,026",
                          "14,196,219"], ["sop", "pooler"]),
    ("roberta_base.py", ["seq_len=512,", "642,393", "124,645,632"],
     ["sop"])])
def test_cli_describes_each_family(config, want, refused):
  result = _cli(f"--config=configs/{config}")
  assert result.returncode == 0, result.stderr
  for text in want:
    assert text in result.stdout, text
  names = {line.split()[0] for line in result.stdout.splitlines() if line}
  for name in refused:
    assert name not in names, name
  run = load_run(config.removesuffix(".py"))
  cfg = ModelConfig.from_dict(run.model)
  total = summary.one_sequence(
      run, cfg, cfg.max_length,
      cfg.max_length if run_spec.kind(run) == "causal_lm" else 20
  ).flops_per_step
  assert f"training FLOPs per sequence: {total:,}" in result.stdout

