"""The config files: they load, their `:arg`s work, and they build the
published models (parameter counts checked to the last scalar)."""

import dataclasses
import importlib.util
import math

from absl import flags
import jax
import jax.numpy as jnp
from locations import CONFIGS as CONFIG_DIR
from ml_collections import config_flags
import numpy as np
import pytest

from albert_jax import Albert
from albert_jax import ModelConfig
from albert_jax.interop import hf_config
from albert_jax.interop import tf_checkpoint
from albert_jax.model import layers
from albert_jax.training import run_spec

CONFIG_NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.py"))
# Fine-tuning configs: their model section holds overrides of the
# pre-trained checkpoint's config (None = keep the checkpoint's value).
FINETUNE_NAMES = ("bundled", "choice", "classify", "glue", "ner", "race",
                  "squad")
PRETRAIN_NAMES = sorted(set(CONFIG_NAMES) - set(FINETUNE_NAMES))

# (AlbertModel / BertModel incl. pooler, MLM head, SOP head). The MLM head
# excludes the tied word table but includes its output bias [V].
PUBLISHED = {
    "albert_base": (11_683_584, 128_688, 1_538),
    "albert_large": (17_683_968, 161_456, 2_050),
    "albert_xlarge": (58_724_864, 292_528, 4_098),
    "albert_xxlarge": (222_595_584, 554_672, 8_194),
    "bert_base": (109_482_240, None, None),
    "bert_large": (335_141_888, None, None),
}
ALBERT_SIZES = ("base", "large", "xlarge", "xxlarge")
# Every argument each file documents, as written on a command line.
ARGS = {
    **{f"albert_{s}": ["version=1", "version=2"] for s in ALBERT_SIZES},
    "bert_base": ["", "recipe=bert", "recipe=albert"],
    "bert_large": ["", "recipe=albert"],
    "tiny": ["share=none,projection=false", "share=attention,inner=2",
             "layers=4,groups=2,share=ffn", "dropout=0.1,act=gelu",
             "dtype=bfloat16"],
    "glue": [f"task={t}" for t in ("cola", "sst2", "mrpc", "qqp", "stsb",
                                   "mnli", "qnli", "rte", "wnli")],
    "squad": ["version=1.1", "version=2.0"],
    "race": ["subset=all", "subset=high", "subset=middle"],
    "classify": ["", "steps=50,lr=1e-4,batch=8,seq=64"],
    "bundled": ["", "task=spam,steps=20"],
    "ner": ["", "source=files,steps=50,lr=1e-4,batch=8,seq=64"],
    "choice": ["", "steps=50,lr=1e-4,batch=8,seq=64"],
    "demo": ["", "steps=100,finetune_steps=0", "quick", "task=spam"],
    "roberta_base": ["size=base", "size=tiny"],
    "gpt_small": ["", "tiny", "epochs=3,corpus_tokens=1000000"],
    "electra_small": ["", "tiny"],
    "electra_base": ["", "tiny"],
}
# The objective (`config.pretraining`) each pre-training file selects.
KINDS = {
    **{n: "masked_lm" for n in PRETRAIN_NAMES},
    "gpt_small": "causal_lm",
    "electra_small": "electra",
    "electra_base": "electra",
}


def load_module(name):
  spec = importlib.util.spec_from_file_location(
      f"configs_{name}", CONFIG_DIR / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(name, arg=None):
  return load_module(name).get_config(arg)


def parse_flags(spec, *overrides):
  """What `--config=spec [overrides]` gives a program, via config_flags."""
  argv = ["prog", f"--config={spec}", *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  return values.config


def count_params(cfg, **kwargs):
  model = Albert(cfg, **kwargs)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))


def test_config_dir_has_the_presets():
  assert set(PUBLISHED) | {"tiny"} <= set(CONFIG_NAMES)


def test_config_kinds_cover_every_file():
  assert {get_config(n).get("job", "pretrain") for n in PRETRAIN_NAMES} == {
      "pretrain"}
  assert {get_config(n).job for n in FINETUNE_NAMES} == {"finetune"}


@pytest.mark.parametrize("name", FINETUNE_NAMES)
def test_finetune_config_model_section_overrides_a_checkpoint(name):
  """Every ModelConfig field can be overridden; those set are valid and go
  on top of a checkpoint's config."""
  config = get_config(name)
  assert set(config.model.keys()) == set(ModelConfig().to_dict())
  overrides = {k: v for k, v in config.model.items() if v is not None}
  assert set(overrides) == {"hidden_dropout_prob",
                            "attention_probs_dropout_prob"}
  base = ModelConfig(vocab_size=123).to_dict()
  merged = ModelConfig.from_dict({**base, **overrides})
  assert merged.vocab_size == 123
  # An empty field takes a typed value from the command line.
  spec = str(CONFIG_DIR / f"{name}.py")
  flagged = parse_flags(spec, "--config.model.hidden_size=1024",
                        "--config.init=/some/checkpoint")
  assert flagged.model.hidden_size == 1024 and flagged.init == (
      "/some/checkpoint")


def test_finetune_configs_carry_table_14():
  """Spot checks of the paper's Table 14 (lr, batch, dropout, steps,
  warmup, length)."""
  def row(c):
    return (c.optimizer.learning_rate, c.batch_size,
            c.model.hidden_dropout_prob, c.num_train_steps,
            c.optimizer.warmup_steps, c.data.max_seq_length)
  assert row(get_config("glue", "task=mnli")) == (
      3e-5, 128, 0.0, 10000, 1000, 512)
  assert row(get_config("glue", "task=rte")) == (3e-5, 32, 0.1, 800, 200, 512)
  assert row(get_config("squad", "version=1.1")) == (
      5e-5, 48, 0.0, 3649, 365, 384)
  assert row(get_config("squad", "version=2.0")) == (
      3e-5, 48, 0.0, 8144, 814, 512)
  assert row(get_config("race")) == (2e-5, 32, 0.1, 12000, 1000, 512)
  with pytest.raises(ValueError, match="choose one of"):
    get_config("glue", "task=mnlii")


@pytest.mark.parametrize("name", PRETRAIN_NAMES)
def test_every_config_loads_and_round_trips(name):
  config = get_config(name)
  assert config.seed == 0
  cfg = ModelConfig.from_dict(config.model)
  # Every ModelConfig field is spelled out, so a round trip loses nothing.
  assert cfg.to_dict() == config.model.to_dict()
  assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_args_cover_every_config_file():
  assert sorted(ARGS) == CONFIG_NAMES


@pytest.mark.parametrize("name,arg",
                         [(n, a) for n, args in ARGS.items() for a in args])
def test_arg_string_through_config_flags(name, arg):
  path = CONFIG_DIR / f"{name}.py"
  spec = f"{path}:{arg}" if arg else str(path)
  config = parse_flags(spec)
  assert config.is_locked
  assert config.to_dict() == get_config(name, arg or None).to_dict()
  if name in FINETUNE_NAMES:
    return
  cfg = ModelConfig.from_dict(config.model)
  # What the trainer builds from it: objective, model and FLOPs, validated
  # (no tracing or compiling).
  run = run_spec.run_spec(config)
  assert run_spec.kind(config) == run.kind == KINDS[name]
  assert run.model_config == cfg
  assert run.flops_per_step > 0
  assert run.masked == (KINDS[name] != "causal_lm")
  batch, seq = config.batch_size, config.data.max_seq_length
  assert run.batch_schema["input_ids"] == ((batch, seq), jnp.int32)


@pytest.mark.parametrize("size", ALBERT_SIZES)
def test_albert_versions(size):
  v1 = get_config(f"albert_{size}", "version=1").model
  v2 = get_config(f"albert_{size}", "version=2").model
  assert get_config(f"albert_{size}").to_dict() == get_config(
      f"albert_{size}", "version=2").to_dict()
  # xxlarge was released without dropout in both versions.
  want = 0.0 if size == "xxlarge" else 0.1
  assert v1.hidden_dropout_prob == v1.attention_probs_dropout_prob == want
  assert v2.hidden_dropout_prob == v2.attention_probs_dropout_prob == 0.0
  # Both releases were trained with the official code's "gelu", the tanh
  # form (test_albert_v1_activation_on_each_path).
  assert v1.hidden_act == v2.hidden_act == "gelu_new"
  other = {k: v for k, v in v1.items()
           if k not in ("hidden_dropout_prob", "attention_probs_dropout_prob")}
  assert other == {k: v2[k] for k in other}


# ALBERT-base v1's settings (dropout 0.1, "gelu") under the keys that both
# the official albert_config.json and HF's config.json use.
V1_BASE = dict(vocab_size=30000, embedding_size=128, hidden_size=768,
               num_hidden_layers=12, num_hidden_groups=1,
               num_attention_heads=12, intermediate_size=3072,
               inner_group_num=1, hidden_act="gelu", hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, max_position_embeddings=512,
               type_vocab_size=2, initializer_range=0.02)


def test_albert_v1_activation_on_each_path():
  """The v1 releases' "gelu", read three ways.

  - Training from scratch (configs/albert_*.py:version=1): gelu_new, the
    tanh form, which the official modeling.py's gelu() computes for
    "gelu" and so the form the releases were trained with.
  - An official TF v1 checkpoint (albert_config.json "gelu"): gelu_new,
    so the weights run with the activation they were trained with, and its
    model equals configs/albert_base.py:version=1's.
  - An HF v1 checkpoint (config.json "gelu"): "gelu", the exact erf form,
    as transformers runs it (ACT2FN["gelu"]), for parity with transformers.
  """
  scratch = ModelConfig.from_dict(
      get_config("albert_base", "version=1").model)
  tf_v1 = tf_checkpoint.config_from_tf(
      {**V1_BASE, "net_structure_type": 0, "gap_size": 0,
       "num_memory_blocks": 0, "down_scale_factor": 1})
  hf_v1 = hf_config.config_from_hf({**V1_BASE, "model_type": "albert",
                                    "layer_norm_eps": 1e-12})
  assert (scratch.hidden_act, tf_v1.hidden_act, hf_v1.hidden_act) == (
      "gelu_new", "gelu_new", "gelu")
  assert layers.activation("gelu_new") is layers.gelu_tanh
  assert layers.activation("gelu") is layers.gelu_erf
  assert tf_v1 == scratch
  assert hf_v1 == dataclasses.replace(scratch, hidden_act="gelu")


def test_unknown_arg_fails_with_suggestion():
  with pytest.raises(ValueError, match="did you mean 'version'"):
    get_config("albert_base", "verison=1")
  with pytest.raises(ValueError, match="did you mean 'share'"):
    get_config("tiny", "shared=none")
  with pytest.raises(ValueError, match="Unknown config argument"):
    get_config("bert_base", "version=1")  # BERT takes no arguments
  with pytest.raises(flags.IllegalFlagValueError, match="did you mean"):
    parse_flags(f"{CONFIG_DIR / 'albert_base.py'}:verison=1")


def test_bad_arg_values_fail():
  with pytest.raises(ValueError, match="version must be 1 or 2"):
    get_config("albert_large", "version=3")
  with pytest.raises(ValueError, match="share"):
    get_config("tiny", "share=some")
  with pytest.raises(ValueError, match="num_hidden_groups must be 1"):
    get_config("tiny", "share=none,groups=2")
  with pytest.raises(ValueError, match="unknown task='ham'; use one of "
                     "source, spam"):
    get_config("demo", "task=ham")


def test_demo_tasks():
  # The default fine-tune: the held-out corpus-source task, few train rows.
  source = get_config("demo").finetune
  assert source.data.split_from == "bundled/labeled/corpus_source.tsv.gz"
  assert tuple(source.data.split_fractions) == (0.06, 0.24, 0.7)
  assert len(source.predict_texts) == 3 and source.compare_random_init
  spam = get_config("demo", "task=spam").finetune
  assert spam.data.split_from == "bundled/labeled/spam_assassin.tsv.gz"
  assert tuple(spam.data.split_fractions) == (0.8, 0.1, 0.1)
  assert "FREE $1000" in spam.predict_texts[0]


def test_field_overrides_via_flags():
  config = parse_flags(str(CONFIG_DIR / "albert_base.py") + ":version=1",
                       "--config.model.num_hidden_layers=24",
                       "--config.model.hidden_act=relu")
  assert config.model.num_hidden_layers == 24
  assert config.model.hidden_act == "relu"
  assert config.model.hidden_dropout_prob == 0.1
  with pytest.raises(AttributeError, match="num_hidden_layers"):
    parse_flags(str(CONFIG_DIR / "albert_base.py"),
                "--config.model.num_hidden_layer=24")


def test_tiny_args():
  default = get_config("tiny").model
  assert (default.vocab_size, default.embedding_size, default.hidden_size,
          default.num_hidden_layers, default.num_attention_heads,
          default.intermediate_size, default.max_position_embeddings) == (
              1000, 32, 64, 2, 4, 128, 128)
  assert default.share == "all" and default.embedding_projection
  bert = get_config("tiny", "share=none,projection=false").model
  assert bert.share == "none" and not bert.embedding_projection
  assert bert.embedding_size == bert.hidden_size == 64
  grouped = get_config("tiny", "layers=4,groups=2,inner=2").model
  assert (grouped.num_hidden_layers, grouped.num_hidden_groups,
          grouped.inner_group_num) == (4, 2, 2)
  wet = get_config("tiny", "dropout=0.1,act=relu,dtype=bfloat16").model
  assert wet.hidden_dropout_prob == wet.attention_probs_dropout_prob == 0.1
  assert (wet.hidden_act, wet.dtype) == ("relu", "bfloat16")


def _random_params(model, ids, seed):
  """Params of the right tree and shapes, without compiling `init`.

  Compiling `init` costs ~7 s on CPU (the model's own tests cover it); the
  forward pass does not care where its params came from, only that the tree
  the config builds is one `apply` accepts.
  """
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))
  rng = np.random.default_rng(seed)
  def fill(path, leaf):
    name = jax.tree_util.keystr(path)
    base = 1.0 if "scale" in name else 0.0
    return jnp.asarray(base + 0.02 * rng.standard_normal(leaf.shape),
                       leaf.dtype)
  return jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.mark.parametrize("arg", [None, "share=none,projection=false,inner=2"])
def test_tiny_model_runs_forward(arg):
  cfg = ModelConfig.from_dict(get_config("tiny", arg).model)
  model = Albert(cfg)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 16)), jnp.int32)
  mask = jnp.ones((2, 16), jnp.int32).at[1, 12:].set(0)
  positions = jnp.asarray([[1, 5, 7], [0, 2, 11]], jnp.int32)
  params = _random_params(model, ids, seed=1)
  out = jax.jit(model.apply)(params, ids, attention_mask=mask,
                             masked_positions=positions)
  assert out["sequence_output"].shape == (2, 16, cfg.hidden_size)
  assert out["pooled_output"].shape == (2, cfg.hidden_size)
  assert out["mlm_logits"].shape == (2, 3, cfg.vocab_size)
  assert out["sop_logits"].shape == (2, 2)
  for value in out.values():
    assert bool(jnp.all(jnp.isfinite(value)))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name):
  cfg = ModelConfig.from_dict(get_config(name).model)
  encoder, mlm, sop = PUBLISHED[name]
  base = count_params(cfg, heads=())
  assert base == encoder
  if mlm is not None:
    with_mlm = count_params(cfg, heads=("mlm",))
    assert with_mlm - base == mlm
    assert count_params(cfg) - with_mlm == sop



def test_bert_trains_by_berts_recipe_unless_asked_for_albert():
  bert = get_config("bert_base")
  assert (bert.data.objective, bert.masking.max_ngram, bert.masking.whole_word,
          bert.masking.max_predictions, bert.data.max_seq_length) == (
              "nsp", 1, False, 76, 512)
  o = bert.optimizer
  assert (o.name, o.learning_rate, o.warmup_steps, o.bias_correction,
          o.weight_decay, o.clip_norm, o.eps) == (
              "adamw", 1e-4, 10_000, False, 0.01, 1.0, 1e-6)
  assert (bert.batch_size, bert.num_train_steps) == (256, 1_000_000)
  as_albert = get_config("bert_base", "recipe=albert").to_dict()
  albert = get_config("albert_base").to_dict()
  for key in ("data", "masking", "optimizer", "batch_size", "num_train_steps"):
    assert as_albert[key] == albert[key], key
  with pytest.raises(ValueError, match="Unknown BERT recipe 'roberta'; "
                     "choose one of bert, albert."):
    get_config("bert_large", "recipe=roberta")


def test_tiny_runs_at_cpu_size():
  """configs/tiny.py is for CPU smoke runs: its run, not only its model, is
  small (it kept the paper's batch 4096 for 125k steps, 10 GB of RAM)."""
  c = get_config("tiny")
  assert (c.batch_size, c.num_train_steps, c.optimizer.warmup_steps) == (
      8, 100, 10)
  assert (c.eval_every_steps, c.checkpoint_every_steps, c.eval_batches,
          c.data.max_seq_length) == (50, 50, 2, 128)
