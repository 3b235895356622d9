"""The demo's baseline: the same fine-tune from random weights
(`run_after_pretraining(random_init=True)`, `compare_random_init`).

It must differ from the pre-trained fine-tune only in the starting
weights: same model shape, tokenizer, split files and steps.
"""

import gzip
import itertools
import json
import os

import numpy as np
import pytest

import albert_jax
from albert_jax import config_lib
from albert_jax import tree as tree_lib
from albert_jax.finetune import after_pretraining as after
from albert_jax.tools import sweep
from albert_jax.training import pretrain
from locations import CORPUS
from locations import REPO

# Whole runs: the long tier (tests/conftest.py).
pytestmark = pytest.mark.long



def test_random_init_baseline_matches_the_pretrained_fine_tune(
    tiny_spm, tmp_path):
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = [l.strip() for l in itertools.islice(f, 300) if l.strip()]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n\n".join("\n".join(lines[i:i + 6])
                                for i in range(0, len(lines), 6)) + "\n")
  _, module, _ = sweep._load(f"{REPO}/configs/tiny.py")  # pylint: disable=protected-access
  c = module.get_config(None)
  c.model.vocab_size = 300  # tiny_spm's
  c.data.corpus, c.data.tokenizer = str(corpus), tiny_spm
  c.data.max_seq_length, c.masking.max_predictions = 32, 5
  c.batch_size, c.num_train_steps, c.optimizer.warmup_steps = 8, 2, 1
  c.eval_batches = 0
  c.fast_compile = True  # 2 steps: compiling is most of a run
  c.log_every_steps = c.checkpoint_every_steps = c.eval_every_steps = 2
  workdir = str(tmp_path / "run")
  pretrain.run(c, workdir)

  labelled = tmp_path / "labelled.tsv"
  labelled.write_text("text\tlabel\n" + "".join(
      f"{lines[i]}\t{'ab'[i % 2]}\n" for i in range(40)), encoding="utf-8")
  f = config_lib.classify_config(batch_size=4, num_train_steps=2,
                                 warmup_steps=1, max_seq_length=32)
  f.data.split_from, f.data.text_column = str(labelled), "text"
  f.data.label_column = "label"
  f.log_every_steps = f.eval_every_steps = f.checkpoint_every_steps = 2
  f.fast_compile = True
  pre = after.run_after_pretraining(f, workdir)
  rand = after.run_after_pretraining(f, workdir, random_init=True)
  assert pre["step"] == rand["step"] == 2
  assert set(pre) - {"new_predictions"} == set(rand)

  def recorded(name):
    with open(os.path.join(workdir, name, "config.json"),
              encoding="utf-8") as fh:
      return json.load(fh)
  pre_cfg, rand_cfg = recorded("finetune"), recorded(after.RANDOM_INIT_DIR)
  assert pre_cfg["init"] == workdir and rand_cfg["init"] == ""
  assert rand_cfg["data"]["tokenizer"] == tiny_spm
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as fh:
    shape = json.load(fh)["model"]
  for key in ("vocab_size", "hidden_size", "embedding_size",
              "num_hidden_layers", "share", "hidden_act"):
    assert rand_cfg["model"][key] == shape[key], key
  for split in ("train", "eval", "test"):  # the very same rows
    with open(pre_cfg["data"][f"{split}_file"], "rb") as a, open(
        rand_cfg["data"][f"{split}_file"], "rb") as b:
      assert gzip.decompress(a.read()) == gzip.decompress(b.read()) if (
          a.name.endswith(".gz")) else a.read() == b.read()
  # The pre-trained fine-tune starts from the run's word embeddings (two
  # small steps move them little); the baseline starts elsewhere.
  def word_table(tree):
    flat = tree_lib.flatten(tree)
    return np.asarray(next(v for k, v in flat.items()
                           if "word_embeddings" in k))
  start = word_table(albert_jax.load_pretrained(workdir).params)
  near = word_table(albert_jax.load_pretrained(
      os.path.join(workdir, "finetune")).params)
  far = word_table(albert_jax.load_pretrained(
      os.path.join(workdir, after.RANDOM_INIT_DIR)).params)
  assert np.abs(near - start).max() < 0.05
  assert np.abs(far - start).mean() > 10 * np.abs(near - start).mean()
