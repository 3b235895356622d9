"""The ablation sweep files: their trials, and that every trial is valid.

Each trial's overrides are applied to its base config as the trainer's
`--config.k=v` flags would, then the model section must build a ModelConfig
and the data section name a known objective; nothing is trained.
"""

import copy

from locations import REPO
import pytest

from albert_jax.data import instances
from albert_jax.model.config import ModelConfig
from albert_jax.tools import sweep

DEMO = "configs/demo.py:steps=400,finetune_steps=0"
QUICK = {"num_train_steps": 30, "optimizer.warmup_steps": 3,
         "eval_every_steps": 10}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
  monkeypatch.chdir(REPO)


def _load_config(spec):
  _, module, arg = sweep._load(spec)  # pylint: disable=protected-access
  return module.get_config(arg)


def _configs(spec, config=None):
  """(base config spec, [(trial name, overridden ConfigDict)])."""
  base_spec, trials = sweep.load_sweep(spec, config)
  sweep.validate(base_spec, trials)
  base = _load_config(base_spec)
  out = []
  for name, trial in trials.items():
    c = copy.deepcopy(base)
    for key, value in trial.items():
      *parents, leaf = key.split(".")
      node = c
      for part in parents:
        node = node[part]
      node[leaf] = value
    out.append((name, c))
  return base_spec, out


def _check_valid(configs):
  for name, c in configs:
    ModelConfig.from_dict(c.model)  # raises on an invalid model
    instances.InstanceConfig(max_seq_length=c.data.max_seq_length,
                             objective=c.data.objective)
    assert c.masking.max_predictions <= c.data.max_seq_length, name


def _models(spec, config=None):
  _, configs = _configs(spec, config)
  _check_valid(configs)
  return [ModelConfig.from_dict(c.model) for _, c in configs], configs


def test_sharing_trials():
  base, configs = _configs("experiments/ablate_sharing.py")
  assert base == DEMO
  assert [n for n, _ in configs] == [
      "model.share=all", "model.share=attention", "model.share=ffn",
      "model.share=none"]
  models, _ = _models("experiments/ablate_sharing.py")
  # Table 4's point: parameter copies differ, applied layers do not.
  assert [(m.num_copies("attention"), m.num_copies("ffn")) for m in models] == [
      (1, 1), (1, 4), (4, 1), (4, 4)]
  assert {m.num_steps for m in models} == {4}


def test_sentence_objective_trials():
  _, configs = _models("experiments/ablate_sentence_objective.py")
  assert [(n, c.data.objective) for n, c in configs] == [
      ("data.objective=none", "none"), ("data.objective=nsp", "nsp"),
      ("data.objective=sop", "sop")]


def test_dropout_trials():
  models, _ = _models("experiments/ablate_dropout.py")
  assert [(m.hidden_dropout_prob, m.attention_probs_dropout_prob)
          for m in models] == [(0.1, 0.1), (0.0, 0.0)]


def test_embedding_trials_follow_the_base_models_hidden_size():
  models, configs = _models("experiments/ablate_embedding.py")
  demo = [(m.share, m.embedding_size, m.embedding_projection, m.hidden_size)
          for m in models]
  assert demo == [(s, e, e != 128, 128) for s in ("none", "all")
                  for e in (16, 32, 64, 128)]
  assert configs[3][0] == ("model.share=none,model.embedding_size=128,"
                           "model.embedding_projection=false")
  # Paper scale is the one --config override, as for the other ablations:
  # Table 3's widths for ALBERT-base's H = 768.
  models, _ = _models("experiments/ablate_embedding.py",
                      "configs/albert_base.py")
  assert [(m.share, m.embedding_size, m.embedding_projection, m.hidden_size)
          for m in models] == [(s, e, e != 768, 768) for s in ("none", "all")
                               for e in (64, 128, 256, 768)]
  # A base model whose H the sweep has no widths for is refused by name.
  with pytest.raises(ValueError, match=r"model.hidden_size is 1024.*H in "
                     r"\[128, 768\].*WIDTHS"):
    sweep.load_sweep("experiments/ablate_embedding.py",
                     "configs/albert_large.py")


@pytest.mark.parametrize("spec,paper_config", [
    ("experiments/ablate_sharing.py", "configs/albert_base.py"),
    ("experiments/ablate_sentence_objective.py", "configs/albert_base.py"),
    ("experiments/ablate_dropout.py", "configs/albert_xxlarge.py"),
    ("experiments/ablate_embedding.py", "configs/albert_base.py"),
])
def test_paper_scale_is_one_config_flag(spec, paper_config):
  demo_models, _ = _models(spec)
  models, configs = _models(spec, paper_config)
  assert len(models) == len(demo_models)
  paper_model = ModelConfig.from_dict(_load_config(paper_config).model)
  assert {m.hidden_size for m in models} == {paper_model.hidden_size}
  assert {c.batch_size for _, c in configs} == {4096}
  # The documented command names that config.
  assert f"--config={paper_config}" in (REPO / spec).read_text()


@pytest.mark.parametrize("spec", [
    "experiments/ablate_sharing.py", "experiments/ablate_sentence_objective.py",
    "experiments/ablate_dropout.py", "experiments/ablate_embedding.py"])
def test_quick_adds_a_short_schedule_to_every_trial(spec):
  _, full = sweep.load_sweep(spec)
  _, quick = sweep.load_sweep(spec + ":quick")
  assert list(quick.values()) == [{**t, **QUICK} for t in full.values()]
  _, configs = _configs(spec + ":quick")
  _check_valid(configs)
  assert {(c.num_train_steps, c.eval_every_steps) for _, c in configs} == {
      (30, 10)}


def test_a_misspelt_argument_is_refused():
  with pytest.raises(ValueError, match="Unknown config argument 'quik'"):
    sweep.load_sweep("experiments/ablate_embedding.py:quik")


@pytest.mark.parametrize("spec", [
    "experiments/ablate_sharing.py", "experiments/ablate_sentence_objective.py",
    "experiments/ablate_dropout.py", "experiments/ablate_embedding.py"])
def test_every_ablation_starts_from_the_demo_pretraining(spec):
  base, _ = sweep.load_sweep(spec)
  assert base == DEMO == sweep.ABLATION_CONFIG
  assert QUICK == {k.removeprefix("config."): v
                   for k, v in sweep.QUICK.items()}
