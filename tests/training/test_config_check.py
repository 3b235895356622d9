"""Every config value is checked at start (albert_jax/training/config_check.py)."""

import importlib.util
import math
import subprocess
import sys

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from locations import CONFIGS
from locations import REPO
import ml_collections
import pytest

from albert_jax.training import config_check
from albert_jax.model.config import ModelConfig
from albert_jax.training import optimizer

from plugin_noise import without_plugin_noise  # pylint: disable=g-bad-import-order


def load(name, arg=None):
  spec = importlib.util.spec_from_file_location(f"c_{name}",
                                                CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def message(config) -> str:
  with pytest.raises(config_check.ConfigError) as e:
    config_check.check(config)
  assert "\n" not in str(e.value)
  return str(e.value)


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.py")))
def test_every_shipped_config_passes(name):
  config_check.check(load(name))


@pytest.mark.parametrize("key", ["accumulation_steps", "checkpoint_every_steps",
                                 "log_every_steps", "eval_every_steps",
                                 "batch_size"])
def test_zero_cadences_and_sizes(key):
  c = load("tiny")
  c[key] = 0
  example = {"accumulation_steps": 1, "checkpoint_every_steps": 1000,
             "log_every_steps": 50, "eval_every_steps": 1000,
             "batch_size": 32}[key]
  suffix = " (1: no accumulation)" if key == "accumulation_steps" else ""
  assert message(c) == (f"config.{key}=0 must be a whole number >= 1{suffix}, "
                        f"e.g. --config.{key}={example}.")


@pytest.mark.parametrize("value,hint", [("bogus", ""),
                                        ("SOP", " (did you mean 'sop'?)")])
def test_objective_typos(value, hint):
  c = load("tiny")
  c.data.objective = value
  assert message(c) == (
      f"config.data.objective={value!r} must be one of ('sop', 'nsp', "
      f"'none'){hint}, e.g. --config.data.objective=sop.")


def test_float16_is_refused_with_the_reason():
  c = load("tiny")
  c.model.dtype = "float16"
  assert message(c) == (
      "config.model.dtype='float16' must be one of ('float32', 'bfloat16') "
      "(float16 needs loss scaling, which albert_jax does not do; bfloat16 "
      "has float32's range) (did you mean 'bfloat16'?), e.g. "
      "--config.model.dtype=bfloat16.")


def test_cross_field_rules():
  c = load("tiny")
  c.batch_size, c.accumulation_steps = 12, 5
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.9, 0.2
  assert message(c) == (
      "config.batch_size=12 must be divisible by config.accumulation_steps=5 "
      "(each step splits the batch into that many micro-batches), e.g. "
      "--config.accumulation_steps=1; config.masking.mask_token_prob=0.9 + "
      "config.masking.random_token_prob=0.2 exceed 1 (the rest of the chosen "
      "tokens stay unchanged); e.g. 0.8 and 0.1.")
  c = load("tiny")
  c.data.max_seq_length = 256  # the tiny model has 128 positions
  assert message(c) == (
      "config.data.max_seq_length=256 needs 256 positions but "
      "config.model.max_position_embeddings=128; raise it, or lower "
      "--config.data.max_seq_length=128.")


def test_the_demos_finetuning_stage_is_checked_too():
  c = load("demo")
  c.finetune.batch_size = -4
  assert message(c) == ("config.batch_size=-4 must be a whole number >= 1, "
                        "e.g. --config.batch_size=32.")


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "albert_jax.main", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=120,
                        check=False)


def test_cli_bad_values_and_flags_are_one_line(tmp_path):
  workdir = tmp_path / "run"
  for args, line in [
      (["--config.log_every_steps=0"],
       "error: config.log_every_steps=0 must be a whole number >= 1, e.g. "
       "--config.log_every_steps=50."),
      (["--num_fake_devices=abc"],
       "error: --num_fake_devices='abc' must be a whole number >= 0, e.g. "
       "--num_fake_devices=8"),
      (["--num_fake_devices=4096"],
       "error: --num_fake_devices=4096 is more CPU devices than one host "
       "stands in for (at most 512); give a smaller slice, e.g. "
       "--num_fake_devices=8"),
      (["--config.finetune_steps=0"],
       "error: Unknown config key 'finetune_steps': config has no field "
       "'finetune_steps' (did you mean 'checkpoint_every_steps', "
       "'num_train_steps' or 'log_every_steps'?). Valid fields there: "
       "accumulation_steps, async_checkpoints, batch_size, best_metric, "
       "checkpoint_every_steps, data, eval_batches, eval_every_steps, "
       "fast_compile, goodput, job, keep_checkpoints, log_every_steps, "
       "masking, "
       "max_consecutive_nonfinite, mesh, model, num_train_steps, optimizer, "
       "peak_tflops_per_device, pretraining, profile, seed, sharding_rules, "
       "take_over_workdir.")]:
    out = _cli("--config=configs/tiny.py", *args, f"--workdir={workdir}")
    assert out.returncode != 0
    assert without_plugin_noise(out.stderr).strip().splitlines() == [line], (
        out.stderr[-3000:])
    assert not workdir.exists()


# Values of every kind a command line can give, the edge cases included.
_VALUES = st.one_of(
    st.integers(-3, 5), st.sampled_from([0, 1, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from(["", "sop", "SOP", "none", "bfloat16", "float16", "x"]),
    st.booleans(), st.none())


def _leaves(config, prefix=""):
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _leaves(value, f"{prefix}{key}.")
    elif isinstance(value, (bool, int, float, str)):
      yield f"{prefix}{key}", value


_TINY = load("tiny")
_KEYS = sorted(k for k, _ in _leaves(_TINY)
               if not k.startswith(("data.corpus", "data.tokenizer",
                                    "data.data_dir", "data.format")))


def _set(config, key, value) -> bool:
  """Sets `key` as `--config.key=value` would; False where the command
  line itself would refuse the value's type."""
  *parents, leaf = key.split(".")
  node = config
  for p in parents:
    node = node[p]
  old = node[leaf]
  if value is None or type(value) is not type(old):  # pylint: disable=unidiomatic-typecheck
    if isinstance(old, float) and isinstance(value, int) and not isinstance(
        value, bool):
      value = float(value)
    else:
      return False
  node[leaf] = value
  return True


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_KEYS), _VALUES), max_size=4))
def test_any_override_either_passes_every_start_check_or_is_one_line(changes):
  """Whatever overrides are drawn, `check` either refuses them in one line,
  or everything the run builds from the config before training (the model
  config, the optimizer and schedule) builds, and its cadences divide."""
  c = load("tiny")
  for key, value in changes:
    _set(c, key, value)
  try:
    config_check.check(c)
  except config_check.ConfigError as e:
    assert "\n" not in str(e) and str(e).startswith(("config.", "model."))
    return
  assert ModelConfig.from_dict(c.model).vocab_size >= 1
  optimizer.make(c.optimizer, c.num_train_steps)
  for key in ("log_every_steps", "eval_every_steps", "checkpoint_every_steps",
              "accumulation_steps"):
    assert 1 % c[key] in (0, 1)  # no ZeroDivisionError
  assert c.batch_size % c.accumulation_steps == 0
  assert math.isfinite(c.optimizer.learning_rate)


def test_an_objective_other_than_the_prepared_datas_is_refused(
    tiny_sop_dataset):
  from albert_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  _, data_dir = tiny_sop_dataset
  c = load("tiny")
  c.data.data_dir, c.data.max_seq_length, c.data.objective = data_dir, 32, "nsp"
  with pytest.raises(ValueError) as e:
    pipeline.ensure_dataset(c.data, "/unused", None, seed=c.seed)
  assert str(e.value) == (
      f"{data_dir} was prepared for data.objective='sop' but "
      "config.data.objective is 'nsp': its sentence labels mean something "
      "else. Set --config.data.objective=sop, or prepare the data again with "
      "--objective nsp.")
  c.data.objective = "sop"
  assert pipeline.ensure_dataset(c.data, "/unused", None,
                                 seed=c.seed) == data_dir
  # Prepared one instance per row: a packed run's batches would not match.
  c.data.pack = 3
  with pytest.raises(ValueError) as e:
    pipeline.ensure_dataset(c.data, "/unused", None, seed=c.seed)
  assert str(e.value) == (
      f"{data_dir} was prepared with pack=0 but config.data.pack is 3; set "
      "--config.data.pack=0, or prepare the data again with --pack 3.")


def test_a_misspelt_best_metric_is_refused_with_the_closest():
  c = load("tiny")
  c.best_metric = "mlm_acuracy"
  assert message(c) == (
      "config.best_metric='mlm_acuracy' is not a metric a masked_lm run "
      "reports (did you mean 'mlm_accuracy'?); choose one of ('mlm_accuracy', "
      "'sop_accuracy'), or '' to keep no best checkpoint, e.g. "
      "--config.best_metric=mlm_accuracy.")
  c = load("roberta_base", "size=tiny")  # no sentence task
  c.best_metric = "sop_accuracy"
  assert "choose one of ('mlm_accuracy',)" in message(c)
  c.best_metric = ""
  config_check.check(c)


def test_pack_values_and_the_objectives_that_refuse_it():
  c = load("tiny")
  for bad in (1, -2, 256):
    c.data.pack = bad
    assert "config.data.pack" in message(c)
  c.data.pack = 3
  config_check.check(c)  # masked LM reads packed rows
  electra = load("electra_small")
  electra.data.pack = 3
  assert "ELECTRA" in message(electra) and "data.pack=0" in message(electra)
  gpt = load("gpt_small")
  gpt.data.pack = 2
  assert "causal_lm" in message(gpt) and "\n" not in message(gpt)


def test_each_choice_list_is_its_owners():
  """config_check copies no list of choices: it reads each from the module
  that acts on the field, and the task families' from the registry."""
  from albert_jax.data import instances  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune import registry  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune.tasks.classification import files  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune.tasks.squad import task as squad_task  # pylint: disable=g-import-not-at-top
  from albert_jax.model import config as model_config  # pylint: disable=g-import-not-at-top
  from albert_jax.text import tokenizer  # pylint: disable=g-import-not-at-top
  from albert_jax.training import run_spec  # pylint: disable=g-import-not-at-top
  owners = {"pretraining": run_spec.KINDS,
            "data.objective": instances.OBJECTIVES,
            "data.tokenizer_type": tokenizer.KINDS,
            "model.dtype": model_config.TRAINING_DTYPES,
            "optimizer.name": optimizer.NAMES,
            "optimizer.schedule": optimizer.SCHEDULES}
  assert config_check.CHOICES.keys() == owners.keys()
  assert all(config_check.CHOICES[k] is v for k, v in owners.items())
  assert registry.config_choices() == {"data.task_type": files.TASK_TYPES,
                                       "data.v2_head": squad_task.V2_HEADS}
  assert set(optimizer.NAMES) == set(optimizer.OPTIMIZERS)
  # Without the families' choices their fields are left to the families.
  c = load("squad", "version=2.0")
  c.data.v2_head = "simpel"
  config_check.check(c)
  assert message_with(c, registry.config_choices()) == (
      "config.data.v2_head='simpel' must be one of ('official', 'simple') "
      "(did you mean 'simple'?), e.g. --config.data.v2_head=simple.")


def message_with(config, choices) -> str:
  with pytest.raises(config_check.ConfigError) as e:
    config_check.check(config, choices=choices)
  return str(e.value)
