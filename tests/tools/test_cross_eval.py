"""albert_jax.tools.cross_eval: runs scored on each other's held-out data.

Three tiny runs (objective none, nsp, sop; one tokenizer, 4 steps each)
train in-process. Each run's score on its own data must equal what its
trainer reported (same eval batches, same masks), so the cross cells come
from the very computation the trainer's evaluation does.
"""

import gzip
import itertools
import json
import shutil

import pytest

from albert_jax.text import train_tokenizer as text_train
from albert_jax.tools import cross_eval
from albert_jax.tools import sweep
from albert_jax.training import pretrain
from locations import CORPUS
from locations import REPO

# Whole runs: the long tier (tests/conftest.py).
pytestmark = pytest.mark.long



def _config(objective, corpus, tokenizer):
  _, module, _ = sweep._load(f"{REPO}/configs/tiny.py")  # pylint: disable=protected-access
  c = module.get_config(None)
  c.model.vocab_size = 300  # tiny_spm's
  c.data.corpus, c.data.tokenizer, c.data.objective = corpus, tokenizer, objective
  c.data.max_seq_length, c.masking.max_predictions = 32, 5
  c.data.eval_fraction = 0.3
  c.batch_size, c.num_train_steps = 8, 4
  c.optimizer.warmup_steps = 1
  c.eval_every_steps = c.checkpoint_every_steps = 4
  c.log_every_steps, c.eval_batches = 2, 2
  c.fast_compile = True  # 4 steps: compiling is most of a run
  return c


@pytest.fixture(scope="module", name="runs")
def fixture_runs(tiny_spm, tmp_path_factory):
  root = tmp_path_factory.mktemp("objectives")
  corpus = root / "corpus.txt"
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = [l.strip() for l in itertools.islice(f, 600) if l.strip()]
  # Documents of six sentences, a blank line between them.
  corpus.write_text("\n\n".join("\n".join(lines[i:i + 6])
                                for i in range(0, len(lines), 6)) + "\n")
  out = {}
  for objective in ("none", "nsp", "sop"):
    workdir = str(root / f"objective={objective}")
    out[objective] = (workdir, pretrain.run(
        _config(objective, str(corpus), tiny_spm), workdir))
  return out


def test_own_data_scores_equal_the_trainers_and_cross_cells_exist(runs):
  dirs = [runs[o][0] for o in ("none", "nsp", "sop")]
  rows = {r["objective"]: r for r in cross_eval.cross_evaluate(dirs)}
  for objective in ("none", "nsp", "sop"):
    final = runs[objective][1]
    assert rows[objective]["step"] == 4
    assert rows[objective]["mlm_accuracy"] == pytest.approx(
        final["eval_mlm_accuracy"], abs=1e-6)
  # The sentence head on its own objective's data: the trainer's number.
  assert rows["nsp"]["nsp_accuracy"] == pytest.approx(
      runs["nsp"][1]["eval_sop_accuracy"], abs=1e-6)
  assert rows["sop"]["sop_accuracy"] == pytest.approx(
      runs["sop"][1]["eval_sop_accuracy"], abs=1e-6)
  # The other objective's pairs are scored too; no head, no cell.
  for cell in (rows["nsp"]["sop_accuracy"], rows["sop"]["nsp_accuracy"]):
    assert 0.0 <= cell <= 1.0
  assert rows["none"]["nsp_accuracy"] is rows["none"]["sop_accuracy"] is None
  table = cross_eval.table(list(rows.values())).splitlines()
  assert table[0] == ("| run | trained on | step | MLM acc. | NSP acc. "
                      "| SOP acc. |")
  assert table[2].startswith("| objective=none | none | 4 | ")
  assert table[2].endswith(" | — | — |")


def test_command_line_writes_the_table(runs, tmp_path, capsys):
  out = tmp_path / "out"
  assert cross_eval.main([runs["nsp"][0], runs["sop"][0],
                          f"--out={out}"]) == 0
  printed = capsys.readouterr().out
  assert (out / "cross_eval.md").read_text() == printed
  rows = json.loads((out / "cross_eval.json").read_text())
  assert [r["objective"] for r in rows] == ["nsp", "sop"]


def test_refusals(runs, tmp_path, capsys):
  assert cross_eval.main([str(tmp_path / "nothing*")]) == 1
  assert capsys.readouterr().err == (
      f"error: {tmp_path}/nothing* matches no directory; give pre-training "
      "workdirs (e.g. a sweep's WORKDIR_ROOT/*/).\n")
  # A run whose tokenizer is not the one the other's data was prepared with.
  other = tmp_path / "other"
  shutil.copytree(runs["sop"][0], other)
  config = json.loads((other / "config.json").read_text())
  # Another 300-piece vocabulary: the same size, other pieces.
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    (tmp_path / "other.txt").write_text(
        "".join(itertools.islice(f, 400, 1200)), encoding="utf-8")
  config["data"]["tokenizer"] = text_train.train(
      str(tmp_path / "other.txt"), 300, output=tmp_path / "other.model",
      seed=2, num_threads=1).path
  (other / "config.json").write_text(json.dumps(config))
  with pytest.raises(cross_eval.CrossEvalError, match=(
      rf"^{other}'s tokenizer differs from the one {runs['nsp'][0]}/data was "
      r"prepared with; cross-evaluate runs that share a tokenizer")):
    cross_eval.cross_evaluate([runs["nsp"][0], str(other)])
