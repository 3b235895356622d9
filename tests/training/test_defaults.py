"""The fields added after workdirs began recording their config: each default
written once (`training/defaults.py`), and older workdirs still load and
resume (`defaults.upgrade`, `defaults.fill`)."""

import importlib.util
import json
import os

import jax
import ml_collections
import numpy as np
import pytest

from albert_jax import sharding as sharding_lib
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.tools import report
from albert_jax.training import checkpoints
from albert_jax.training import defaults
from albert_jax.training import optimizer as optim
from albert_jax.training import pretrain
from albert_jax.training import run_setup
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from locations import CONFIGS
from training.test_checkpoints import tiny_config  # pylint: disable=g-bad-import-order


def _load(path):
  spec = importlib.util.spec_from_file_location(f"c_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(None)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.py")),
                         ids=lambda p: p.stem)
def test_every_shipped_config_has_every_added_field(path):
  """The presets set every field the code reads: `upgrade` adds nothing."""
  config = _load(path)
  assert defaults.upgrade(config) == config.to_dict()


# What a config.json of the first recording version lacks (git history of
# config_lib.py): every field of the tables, and data.tokenizer_type (read
# where absent as SentencePiece, `run_tokenizer.tokenizer_type`).
_ADDED = ("job", "pretraining", "max_consecutive_nonfinite", "fast_compile",
          "take_over_workdir", "profile", "goodput", "optimizer.schedule",
          "optimizer.layerwise_lr_decay", "data.exact_length", "data.pack",
          "data.tokenizer_type", "masking.mask_token_prob",
          "masking.random_token_prob")


def _as_older(config: dict) -> dict:
  for key in _ADDED:
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    del node[leaf]
  return config


def test_upgrade_fills_what_is_missing_and_keeps_the_rest():
  config = tiny_config().to_dict()
  older = _as_older(json.loads(json.dumps(config)))
  upgraded = defaults.upgrade(older)
  assert "job" not in older  # a copy
  upgraded["data"]["tokenizer_type"] = "sentencepiece"  # not a table's
  assert json.loads(json.dumps(upgraded)) == json.loads(json.dumps(config))
  kept = defaults.upgrade({**older, "max_consecutive_nonfinite": 3,
                           "profile": {"num_steps": 2}})
  assert kept["max_consecutive_nonfinite"] == 3
  assert kept["profile"] == {**defaults.RUN["profile"], "num_steps": 2}
  # A fine-tuning config gets the fine-tuning table, not pre-training's.
  tuned = defaults.upgrade({"job": "finetune", "data": {"task": "files"}})
  assert tuned["lm_aux_weight"] == 0.0 and tuned["data"]["pack"] == 0
  assert "masking" not in tuned and "pretraining" not in tuned
  # In place, on a locked ConfigDict (a config file of an earlier version).
  live = ml_collections.ConfigDict(older)
  live.lock()
  defaults.fill(live)
  assert live.max_consecutive_nonfinite == 20 and live.job == "pretrain"


def _older_workdir(config, workdir: str, step: int) -> dict:
  """A workdir as a version from before the added fields left it: a
  checkpoint of `config`'s fresh state at `step`, and a config.json
  without those fields (and no recipe.json, recorded since); that
  config.json's object."""
  mesh = sharding_lib.make_mesh(config.mesh)
  rules = sharding_lib.rules_for(mesh,
                                 [tuple(r) for r in config.sharding_rules])
  spec = run_spec.run_spec(config)
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  state, _ = state_lib.create_state(
      state_lib.state_init_fn(spec.init_params, tx), tx, mesh, rules,
      jax.random.key(0), run_setup.compiler_options(config))
  state["step"] = jax.device_put(np.int32(step), state["step"].sharding)
  mngr = checkpoints.manager(workdir)
  checkpoints.save(mngr, state, {"step": step, "data_position": step})
  mngr.wait_until_finished()
  older = _as_older(json.loads(config.to_json_best_effort()))
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(older, f)
  return older


def test_an_older_workdir_loads_and_resumes(tiny_sop_dataset, tmp_path):
  """A workdir whose config.json lacks the added fields, as an older
  version wrote it, loads (`load_pretrained`, the report) and resumes from
  the older config file (a locked ConfigDict without them)."""
  tokenizer, data_dir = tiny_sop_dataset
  config = tiny_config()
  config.data.tokenizer, config.data.data_dir = tokenizer, data_dir
  config.eval_batches = 0
  config.fast_compile = True
  workdir = str(tmp_path / "w")
  older = _older_workdir(config, workdir, step=2)

  model = load_pretrained(workdir)
  assert model.step == 2 and model.heads == ("mlm", "sop")

  resumed = ml_collections.ConfigDict(older)
  resumed.fast_compile = True  # a field the older file may set again
  resumed.num_train_steps = 3
  resumed.lock()  # as the command line gives it
  result = pretrain.run(resumed, workdir)
  assert result["step"] == 3
  assert checkpoints.available_steps(workdir)[-1] == 3
  path = os.path.join(workdir, "config.json")
  with open(path, encoding="utf-8") as f:
    assert json.load(f)["max_consecutive_nonfinite"] == 20  # filled in
  # The report reads the older config.json too.
  with open(path, "w", encoding="utf-8") as f:
    json.dump(older, f)
  run = report.load_run(workdir)
  assert run.config["job"] == "pretrain" and run.config["data"]["pack"] == 0
  assert report.steps_trained(run) == 3
