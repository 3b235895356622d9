"""ELECTRA: generator config, Gumbel-max sampling, the corrupted input and
its labels, the loss in sum form, shared embeddings, the configs, and a run
end to end through the CLI to an HF ElectraForPreTraining with parity."""

import functools
import gzip
import json
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax.interop import CheckpointError
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model import electra as electra_model
from albert_jax.model.config import ModelConfig
from albert_jax.training import electra as electra_lib
from albert_jax.training import run_spec
from albert_jax.training import step as step_lib
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS as FAST
from locations import CONFIGS
from locations import CORPUS
from locations import REPO

MOBY_DICK = CORPUS.parent / "moby_dick.txt.gz"

VOCAB, MASK_ID = 40, 3
# E=12 < H=24; at fraction 1/4 the generator is 6 wide with its own E→H.
CFG = ModelConfig(vocab_size=VOCAB, embedding_size=12, hidden_size=24,
                  num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=30, max_position_embeddings=16,
                  share="none", hidden_act="gelu", mlm_hidden_act="gelu")
FRACTION = 0.25


def load_config(name, arg=None):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      f"configs_{name}", CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def make_batch():
  """4 rows of 10 with padding (rows 1, 3) and a padding slot in each row's
  masked slots; masked tokens are [MASK] in the input."""
  rng = np.random.default_rng(0)
  original = rng.integers(5, VOCAB, (4, 10)).astype(np.int32)
  mask = np.ones((4, 10), np.int32)
  mask[1, 7:] = 0
  mask[3, 4:] = 0
  original[mask == 0] = 0
  positions = np.array([[1, 4, 0], [2, 3, 6], [5, 0, 0], [1, 2, 0]],
                       np.int32)
  weights = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]],
                     np.float32)
  rows = np.arange(4)[:, None]
  masked_ids = original[rows, positions]
  ids = original.copy()
  real = weights > 0
  ids[np.broadcast_to(rows, positions.shape)[real], positions[real]] = MASK_ID
  ids[2, 5] = original[2, 5]  # a chosen token kept as itself (the 15%)
  types = np.zeros_like(ids)
  types[:, 5:] = 1
  return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
          "masked_positions": positions, "masked_ids": masked_ids,
          "masked_weights": weights,
          "sentence_labels": np.full(4, -1, np.int32)}, original


def abstract_params(disc, fraction):
  """The unboxed parameter shapes of the `Electra` with discriminator `disc`
  and a `fraction`-wide generator: its `RunSpec`'s."""
  gen = electra_model.generator_config(disc, fraction)
  model = electra_model.Electra(disc, gen)
  return run_spec.RunSpec(
      kind="electra", model_config=disc, heads=("rtd",), model=model,
      objective=electra_lib.ElectraObjective(
          model, electra_lib.ElectraOptions(fraction)),
      batch_size=1, seq_len=1, num_predictions=1,
      generator_config=gen).abstract_params()


@pytest.fixture(scope="module")
def setup():
  model = electra_model.Electra(CFG,
                                electra_model.generator_config(CFG, FRACTION))
  # Random values of the parameters' shapes (no init to compile): every one
  # non-trivial, so LayerNorms and biases count.
  rng = np.random.default_rng(1)

  def fill(path, leaf):
    scale = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
    return jnp.asarray(scale + 0.2 * rng.standard_normal(leaf.shape),
                       jnp.float32)
  params = jax.tree_util.tree_map_with_path(
      fill, abstract_params(CFG, FRACTION))
  batch, original = make_batch()
  return model, params, jax.tree.map(jnp.asarray, batch), original


@functools.partial(jax.jit, static_argnums=0, compiler_options=FAST)
def apply(model, params, batch, key):
  return model.apply(
      {"params": params}, batch["input_ids"], batch["masked_positions"],
      batch["masked_ids"], batch["masked_weights"], batch["token_type_ids"],
      batch["attention_mask"], rngs={"sample": key})


################################################################################
# Generator config and options.
################################################################################


def test_generator_config_follows_the_official_rule():
  small = ModelConfig.from_dict(load_config("electra_small").model)
  gen = electra_model.generator_config(small, 0.25)
  assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size,
          gen.embedding_projection) == (64, 1, 256, True)
  base = ModelConfig.from_dict(load_config("electra_base").model)
  # google/electra-base-generator's shape.
  gen = electra_model.generator_config(base, 1 / 3)
  assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size,
          gen.embedding_projection) == (256, 4, 1024, True)
  for field in ("num_hidden_layers", "embedding_size", "vocab_size",
                "max_position_embeddings", "hidden_dropout_prob", "share",
                "hidden_act", "dtype"):
    assert getattr(gen, field) == getattr(base, field), field
  # 290 wide with 4 heads moves to the nearest multiple of 4.
  odd = ModelConfig(hidden_size=580, num_attention_heads=4,
                    embedding_size=128)
  gen = electra_model.generator_config(odd, 0.5)
  assert (gen.hidden_size, gen.num_attention_heads) == (288, 4)
  # As wide as the embeddings: no projection.
  assert not electra_model.generator_config(CFG, 0.5).embedding_projection
  for bad in (0, -0.25, 1.5, True, "0.25"):
    with pytest.raises(ValueError, match=r"generator_fraction must be in "
                       r"\(0, 1\]"):
      electra_model.generator_config(CFG, bad)


def test_options_are_checked():
  config = load_config("electra_small", "tiny")
  assert electra_lib.ElectraOptions.from_config(
      config.electra) == electra_lib.ElectraOptions(0.25, 1.0, 50.0, 1.0)
  del config["electra"]
  with pytest.raises(ValueError, match="needs a config.electra section"):
    run_spec.run_spec(config)
  with pytest.raises(ValueError, match="did you mean 'temperature'"):
    electra_lib.ElectraOptions.from_config({"temprature": 2.0})
  with pytest.raises(ValueError, match="temperature must be a finite"):
    electra_lib.ElectraOptions(temperature=0.0)
  with pytest.raises(ValueError, match="disc_weight must be"):
    electra_lib.ElectraOptions(disc_weight=-1.0)
  with pytest.raises(ValueError, match="nothing to train"):
    electra_lib.ElectraOptions(gen_weight=0.0, disc_weight=0.0)


def test_discriminator_and_generator_counts_equal_transformers():
  """On the meta device: google/electra-{small,base}-discriminator shapes,
  and google/electra-base-generator's."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")

  def hf_count(cls, **kw):
    with torch.device("meta"):
      model = getattr(transformers, cls)(transformers.ElectraConfig(
          vocab_size=30522, **kw))
    return sum(p.numel() for p in model.parameters())  # tied: once

  def count(tree):
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))

  for name, hf in (("electra_small", dict(embedding_size=128,
                                          hidden_size=256,
                                          num_attention_heads=4,
                                          intermediate_size=1024)),
                   ("electra_base", dict(embedding_size=768, hidden_size=768,
                                         num_attention_heads=12,
                                         intermediate_size=3072))):
    spec = run_spec.run_spec(load_config(name))
    cfg, gen_cfg = spec.model_config, spec.generator_config
    params = spec.abstract_params()
    disc = electra_model.part(params, cfg, gen_cfg, "discriminator")[1]
    assert count(disc) == hf_count("ElectraForPreTraining", **hf), name
    if name == "electra_base":
      gen = electra_model.part(params, cfg, gen_cfg, "generator")[1]
      assert count(gen) == hf_count(
          "ElectraForMaskedLM", embedding_size=768, hidden_size=256,
          num_attention_heads=4, intermediate_size=1024)
  assert count(disc) == 109_483_009  # ELECTRA-Base's 110M


def test_flops_add_generator_and_discriminator():
  config = load_config("electra_small", "tiny")
  flops = run_spec.run_spec(config).flops_per_step
  b, t, p, e, v, n = 8, 32, 5, 32, 1000, 2

  def encoder(h, f):
    return (2 * t * e * h + n * t * 8 * h * h + n * t * 4 * t * h
            + n * t * 4 * h * f)
  disc = encoder(64, 128) + t * (2 * 64 * 64 + 2 * 64)
  gen = encoder(16, 64) + p * 2 * 16 * e + p * 2 * e * v
  assert flops == 3 * b * (disc + gen)


################################################################################
# Sampling and the corrupted input.
################################################################################


def test_gumbel_max_samples_the_tempered_softmax():
  logits = jnp.array([0.5, -1.0, 2.0, 0.0, 1.2, -0.3])
  draws = 40_000
  # df = 5; P(chi² > 25.7) = 1e-4 for a correct sampler.
  critical = 25.7

  def chi2(samples, temperature_of_expected, sign=1.0):
    expected = draws * np.asarray(jax.nn.softmax(
        sign * logits / temperature_of_expected))
    observed = np.bincount(np.asarray(samples), minlength=6)
    return float(np.sum((observed - expected) ** 2 / expected))

  for temperature in (1.0, 2.5):
    samples = electra_model.gumbel_max_sample(
        jax.random.key(7), jnp.broadcast_to(logits, (draws, 6)), temperature)
    assert samples.dtype == jnp.int32
    assert chi2(samples, temperature) < critical, temperature
    # A sampler with the wrong temperature or sign fails by far.
    assert chi2(samples, 1.0 if temperature != 1.0 else 2.5) > 20 * critical
    assert chi2(samples, temperature, sign=-1.0) > 20 * critical
  # bfloat16 logits are sampled in float32: the same draws.
  a = electra_model.gumbel_max_sample(jax.random.key(3), logits[None].astype(
      jnp.bfloat16).astype(jnp.float32))
  b = electra_model.gumbel_max_sample(jax.random.key(3),
                                logits[None].astype(jnp.bfloat16))
  np.testing.assert_array_equal(a, b)


def test_labels_mark_exactly_the_tokens_that_changed(setup):
  """The generator forced to always sample token 7: masked slots whose
  original is 7 are not replaced, the others are, and padding slots (which
  point at position 0) change nothing."""
  model, params, batch, original = setup
  forced = jax.tree.map(lambda x: x, params)
  forced["generator_mlm"]["output_bias"] = (
      params["generator_mlm"]["output_bias"].at[7].add(1e4))
  batch = dict(batch)
  original = original.copy()
  original[0, 4] = original[1, 3] = 7
  batch["masked_ids"] = jnp.asarray(np.take_along_axis(
      original, np.asarray(batch["masked_positions"]), 1))
  out = apply(model, forced, batch, jax.random.key(0))
  np.testing.assert_array_equal(out["sampled_ids"], np.full((4, 3), 7))
  np.testing.assert_array_equal(out["original_ids"], original)
  fake = original.copy()
  for (r, p), w in np.ndenumerate(np.asarray(batch["masked_weights"])):
    if w > 0:
      fake[r, batch["masked_positions"][r, p]] = 7
  np.testing.assert_array_equal(out["fake_ids"], fake)
  replaced = fake != original
  assert replaced.sum() == 8 - 2  # 8 real slots, 2 of them already 7
  sums = electra_lib.electra_sums(out, batch, electra_lib.ElectraOptions())
  assert float(sums["rtd_replaced"]) == 6.0
  assert float(sums["sampled_equal"]) == 2.0
  metrics = electra_lib.ElectraObjective(model, electra_lib.ElectraOptions()).metrics(
      sums)
  real = np.asarray(batch["attention_mask"]).sum()
  np.testing.assert_allclose(metrics["replaced_fraction"], 6 / real)
  np.testing.assert_allclose(metrics["sampled_equals_original"], 2 / 8)


def test_loss_is_gen_plus_50_disc_in_numpy(setup):
  model, params, batch, original = setup
  # Token 7 made likely and the original of two slots, so that some samples
  # equal the original (not replaced) and others do not.
  params = jax.tree.map(lambda x: x, params)
  params["generator_mlm"]["output_bias"] = (
      params["generator_mlm"]["output_bias"].at[7].add(4.0))
  original = original.copy()
  original[0, 4] = original[1, 3] = 7
  batch = dict(batch, masked_ids=jnp.asarray(np.take_along_axis(
      original, np.asarray(batch["masked_positions"]), 1)))
  out = jax.tree.map(np.asarray, apply(model, params, batch,
                                       jax.random.key(5)))
  b = jax.tree.map(np.asarray, batch)
  # Generator: mean cross-entropy over the real masked slots.
  logits = out["mlm_logits"].astype(np.float64)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(log_p, b["masked_ids"][..., None], -1)[..., 0]
  w = b["masked_weights"]
  mlm = (ce * w).sum() / (w.sum() + 1e-6)
  # Discriminator: mean sigmoid BCE over the real tokens; a token is
  # replaced where the sample landed and differs from the original.
  fake = original.copy()
  for (r, p), weight in np.ndenumerate(w):
    if weight > 0:
      fake[r, b["masked_positions"][r, p]] = out["sampled_ids"][r, p]
  labels = (fake != original).astype(np.float64)
  assert 0 < labels.sum() < 8  # some samples replaced, not all
  x = out["rtd_logits"].astype(np.float64)
  prob = 1 / (1 + np.exp(-x))
  bce = -(labels * np.log(prob) + (1 - labels) * np.log(1 - prob))
  real = b["attention_mask"] != 0
  rtd = bce[real].sum() / (real.sum() + 1e-6)
  want = mlm + 50 * rtd

  options = electra_lib.ElectraOptions()
  objective = electra_lib.ElectraObjective(model, options)
  sums = electra_lib.electra_sums(out, batch, options)
  dens = objective.denominators(batch)
  # The train step's form: Σ_term sums[term_loss_sum] / denominator.
  loss = sum(sums[f"{t}_loss_sum"] / d for t, d in dens.items())
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  metrics = objective.metrics(sums)
  np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["mlm_loss"]), mlm, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["rtd_loss"]), rtd, rtol=1e-5)
  pred = x > 0
  np.testing.assert_allclose(float(metrics["rtd_accuracy"]),
                             (pred == (labels > 0))[real].mean(), rtol=1e-6)
  tp = (pred & (labels > 0) & real).sum()
  np.testing.assert_allclose(float(metrics["rtd_recall"]),
                             tp / max(labels[real].sum(), 1), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["rtd_precision"]),
                             tp / max(pred[real].sum(), 1), rtol=1e-6)


################################################################################
# Parameters: shared embeddings, the discriminator as an Albert, gradients.
################################################################################


def test_one_embedding_table_and_the_halves_are_albert_models(setup):
  model, params, batch, _ = setup
  assert set(params) == {"embeddings", "encoder", "rtd", "generator_encoder",
                         "generator_mlm"}
  paths = ["/".join(str(k.key) for k in p) for p, _ in
           jax.tree_util.tree_flatten_with_path(params)[0]]
  for table in ("word", "position", "token_type"):
    assert [p for p in paths if f"{table}_embeddings" in p] == [
        f"embeddings/{table}_embeddings/embedding"]

  out = apply(model, params, batch, jax.random.key(2))
  for name, kwargs in (("discriminator", {}), (
      "generator", {"masked_positions": batch["masked_positions"]})):
    cfg, half, heads = electra_model.part(
        params, CFG, electra_model.generator_config(CFG, FRACTION), name)
    albert = albert_lib.Albert(cfg, pooler=False, heads=heads)
    abstract = jax.eval_shape(albert.init, jax.random.key(0),
                              jnp.zeros((1, 10), jnp.int32))
    assert jax.tree.map(lambda x: x.shape, nn.meta.unbox(
        abstract["params"])) == jax.tree.map(jnp.shape, half), name
    ids = out["fake_ids"] if name == "discriminator" else batch["input_ids"]
    ref = jax.jit(albert.apply, compiler_options=FAST)(
        {"params": half}, ids, batch["token_type_ids"],
        batch["attention_mask"], **kwargs)
    key = "rtd_logits" if name == "discriminator" else "mlm_logits"
    np.testing.assert_allclose(out[key], ref[key], atol=1e-6, err_msg=name)


def test_no_gradient_reaches_the_generator_through_the_sample(setup):
  model, params, batch, _ = setup
  objective = electra_lib.ElectraObjective(model, electra_lib.ElectraOptions())
  key = jax.random.key(4)

  @functools.partial(jax.jit, compiler_options=FAST)
  def grads(p):
    def term(name):
      return lambda q: objective.sums(q, batch, key, True)[f"{name}_loss_sum"]
    return jax.grad(term("gen"))(p), jax.grad(term("disc"))(p)

  gen, disc = grads(params)

  def norms(tree):
    return {k: float(optax.tree.norm(v)) for k, v in tree.items()}
  disc_norms, gen_norms = norms(disc), norms(gen)
  assert disc_norms["generator_encoder"] == 0.0
  assert disc_norms["generator_mlm"] == 0.0
  assert gen_norms["encoder"] == gen_norms["rtd"] == 0.0
  for name in ("embeddings", "encoder", "rtd"):
    assert disc_norms[name] > 0.0, name
  for name in ("embeddings", "generator_encoder", "generator_mlm"):
    assert gen_norms[name] > 0.0, name
  # The shared table receives both losses' gradients.
  word = lambda g: g["embeddings"]["word_embeddings"]["embedding"]  # noqa
  assert float(jnp.abs(word(gen)).sum()) > 0
  assert float(jnp.abs(word(disc)).sum()) > 0


def test_accumulation_equals_one_big_batch(setup):
  """Two micro-batches with different padding and slot counts give the
  big batch's loss, metrics and update. The sample is made deterministic
  (temperature → 0 against logits with clear gaps), since each micro-batch
  draws its own noise."""
  model, params, batch, _ = setup
  params = jax.tree.map(lambda x: x, params)
  params["generator_mlm"]["output_bias"] = params["generator_mlm"][
      "output_bias"] + jax.random.normal(jax.random.key(9), (VOCAB,))
  objective = electra_lib.ElectraObjective(
      model, electra_lib.ElectraOptions(temperature=1e-6))
  tx = optax.sgd(0.5)
  state = {"step": jnp.zeros([], jnp.int32), "params": params,
           "opt_state": tx.init(params),
           "rng": jax.random.key_data(jax.random.key(0))}
  results = []
  for steps in (1, 2):
    step = jax.jit(step_lib.make_train_step(objective, tx, lambda s: 0.5,
                                            steps), compiler_options=FAST)
    results.append(step(state, batch))
  (one, m1), (two, m2) = results
  for key in ("loss", "mlm_loss", "rtd_loss", "rtd_accuracy",
              "replaced_fraction", "rtd_recall"):
    np.testing.assert_allclose(m1[key], m2[key], rtol=1e-5, err_msg=key)
  assert 0 < float(m1["replaced_fraction"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
               one["params"], two["params"])
  # Every parameter was trained (but attention's key bias, whose gradient
  # softmax cancels up to rounding).
  for path, moved in jax.tree_util.tree_flatten_with_path(jax.tree.map(
      lambda a, b: float(jnp.abs(a - b).max()), one["params"], params))[0]:
    name = jax.tree_util.keystr(path)
    assert (moved > 1e-4) != name.endswith("['key']['bias']"), name


def test_eval_samples_are_random_but_repeatable(setup):
  model, params, batch, _ = setup
  objective = electra_lib.ElectraObjective(model, electra_lib.ElectraOptions())
  sums = jax.jit(lambda p, b: objective.sums(p, b, None, True),
                 compiler_options=FAST)
  first, again = sums(params, batch), sums(params, batch)
  for k in first:
    np.testing.assert_array_equal(first[k], again[k], err_msg=k)
  # The eval key depends on the batch, so another batch draws other noise.
  swapped = dict(batch, input_ids=batch["input_ids"][::-1])
  assert not np.array_equal(
      jax.random.key_data(electra_lib.eval_key(batch)),
      jax.random.key_data(electra_lib.eval_key(swapped)))
  # Samples, not the argmax: over many keys some differ from it.
  out = apply(model, params, batch, electra_lib.eval_key(batch))
  argmax = np.asarray(out["mlm_logits"]).argmax(-1)
  differs = [np.any(np.asarray(apply(model, params, batch, jax.random.key(
      i))["sampled_ids"]) != argmax) for i in range(3)]
  assert any(differs)


################################################################################
# End to end: the CLI, load_pretrained and transformers.
################################################################################


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """12 steps of configs/electra_small.py:tiny on ~60 documents."""
  corpus = tmp_path_factory.mktemp("corpus") / "moby.txt.gz"
  with gzip.open(MOBY_DICK, "rt", encoding="utf-8") as f, gzip.open(
      corpus, "wt", encoding="utf-8") as g:
    docs = 0
    for line in f:
      g.write(line)
      docs += line.strip() == ""
      if docs >= 60:
        break
  workdir = str(tmp_path_factory.mktemp("electra"))
  proc = subprocess.run(
      [sys.executable, "-m", "albert_jax.main",
       "--config=configs/electra_small.py:tiny", "--config.fast_compile=True",
       "--config.num_train_steps=12", "--config.log_every_steps=3",
       "--config.eval_every_steps=12", "--config.checkpoint_every_steps=12",
       "--config.model.vocab_size=600", f"--config.data.corpus={corpus}",
       f"--workdir={workdir}"],
      cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


@pytest.mark.long
def test_tiny_config_trains_end_to_end(trained):
  final = json.load(open(os.path.join(trained, "final_metrics.json")))
  assert final["step"] == 12 and final["skipped_steps"] == 0
  np.testing.assert_allclose(
      final["eval_loss"],
      final["eval_mlm_loss"] + 50 * final["eval_rtd_loss"], rtol=1e-5)
  # About 15% of the tokens are masked, most of them replaced.
  assert 0.05 < final["eval_replaced_fraction"] < 0.2
  for key in ("eval_rtd_accuracy", "eval_rtd_precision", "eval_rtd_recall",
              "eval_sampled_equals_original", "eval_mlm_accuracy"):
    assert 0.0 <= final[key] <= 1.0, key
  rows = [json.loads(line) for line in open(
      os.path.join(trained, "tensorboard", "metrics.jsonl"))]
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  assert len(losses) == 4 and losses[-1] < losses[0]


def _hf_inputs(vocab):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, vocab, (3, 12))
  mask = np.ones_like(ids)
  mask[1, 8:] = 0
  mask[2, 3:] = 0
  ids[mask == 0] = 0
  types = np.zeros_like(ids)
  types[:, 6:] = 1
  return ids, types, mask


@pytest.mark.long
def test_workdir_exports_to_transformers_with_parity(trained, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  ids, types, mask = _hf_inputs(600)
  kw = dict(input_ids=torch.as_tensor(ids),
            token_type_ids=torch.as_tensor(types),
            attention_mask=torch.as_tensor(mask))
  real = mask != 0
  loaded = {}
  for part, cls, key in (
      ("discriminator", "ElectraForPreTraining", "rtd_logits"),
      ("generator", "ElectraForMaskedLM", "mlm_logits")):
    pt = loaded[part] = load_pretrained(trained, electra_part=part)
    assert pt.step == 12 and not pt.pooler and pt.model_type == "electra"
    assert pt.tokenizer is not None
    out = pt(ids, types, mask)
    pt.to_hf(str(tmp_path / part))
    written = json.load(open(tmp_path / part / "config.json"))
    assert written["architectures"] == [cls]
    hf = getattr(transformers, cls).from_pretrained(str(tmp_path / part))
    with torch.no_grad():
      logits = hf(**kw).logits.numpy()
      hidden = hf.electra(**kw).last_hidden_state.numpy()
    np.testing.assert_allclose(np.asarray(out[key])[real], logits[real],
                               atol=1e-5, err_msg=part)
    np.testing.assert_allclose(np.asarray(out["sequence_output"])[real],
                               hidden[real], atol=1e-5, err_msg=part)
  disc, gen = loaded["discriminator"], loaded["generator"]
  assert disc.heads == ("rtd",) and disc.model_config.hidden_size == 64
  assert gen.heads == ("mlm",) and gen.model_config.hidden_size == 16
  # The discriminator is the default part.
  jax.tree.map(np.testing.assert_array_equal, load_pretrained(trained).params,
               disc.params)
  # One table: the parts' embeddings are the same arrays.
  jax.tree.map(np.testing.assert_array_equal, disc.params["embeddings"],
               gen.params["embeddings"])


@pytest.mark.long
def test_electra_part_errors(trained, tmp_path):
  with pytest.raises(CheckpointError, match="choose one of"):
    load_pretrained(trained, electra_part="critic")
  other = tmp_path / "mlm_run"
  other.mkdir()
  config = load_config("tiny")
  (other / "config.json").write_text(config.to_json_best_effort())
  with pytest.raises(CheckpointError, match="applies to ELECTRA runs"):
    load_pretrained(str(other), electra_part="generator")
  hf_dir = tmp_path / "hf_electra"
  hf_dir.mkdir()
  (hf_dir / "config.json").write_text(json.dumps({"model_type": "electra"}))
  with pytest.raises(CheckpointError,
                     match="ELECTRA training workdirs only"):
    load_pretrained(str(hf_dir), electra_part="generator")
