"""training/pretrain.py's rows a step (`rows_per_step`): one instance a
row, `batch_size` rows; packed, the rows that hold `batch_size` instances,
fixed at the start and kept by every resume. The run itself is tested end
to end in test_main.py, test_resume.py and test_learnability.py."""

import json

import pytest

from albert_jax import config_lib
from albert_jax.data import loader
from albert_jax.training import pretrain
from albert_jax.training import recipe


def _data_dir(tmp_path, instances: int, rows: int) -> str:
  """A data_dir whose dataset.json says its train split packs `instances`
  into `rows` (all `rows_per_step` reads)."""
  d = tmp_path / "data"
  d.mkdir()
  (d / "dataset.json").write_text(json.dumps({
      "format": loader.FORMAT,
      "splits": {"train": {"files": [], "instances": instances,
                            "rows": rows}}}))
  return str(d)


def _config(pack: int, batch_size: int = 32):
  c = config_lib.base_config(config_lib.tiny_model(), batch_size=batch_size)
  c.data.pack = pack
  return c


@pytest.mark.parametrize("pack,multiple,want", [
    (0, 1, 32),   # one a row: batch_size rows
    (3, 1, 12),   # 110 in 40 rows, 2.75 a row: 32 / 2.75 = 11.6 → 12
    (3, 8, 16),   # 12 up to a multiple of 8 (data-parallel × accumulation)
])
def test_a_new_run_takes_the_rows_that_hold_batch_size_instances(
    tmp_path, pack, multiple, want):
  workdir = tmp_path / "run"
  workdir.mkdir()
  rows = pretrain.rows_per_step(_config(pack), _data_dir(tmp_path, 110, 40),
                                str(workdir), multiple)
  assert rows == want


def test_a_resume_keeps_the_recorded_rows_whatever_the_data_or_mesh(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  c = _config(3)
  recipe.record(c, str(workdir), rows_per_step=12)
  assert json.loads((workdir / recipe.RECIPE).read_text())[
      "rows_per_step"] == 12
  # The data would now give 16 (2 a row); the run keeps its 12, on 1, 2,
  # 4 or 12 devices.
  data_dir = _data_dir(tmp_path, 80, 40)
  for multiple in (1, 2, 4, 12):
    assert pretrain.rows_per_step(c, data_dir, str(workdir), multiple) == 12
  with pytest.raises(ValueError) as e:
    pretrain.rows_per_step(c, data_dir, str(workdir), 8)
  assert str(e.value) == (
      f"{workdir} trains 12 packed rows a step (its recipe.json), which do "
      "not divide over the data-parallel size × accumulation_steps (8) of "
      "this mesh; resume with a --config.mesh or --config.accumulation_steps "
      "that divides 12.")


def test_a_packed_workdir_of_an_earlier_version_resumes_with_batch_size_rows(
    tmp_path):
  """Before packed steps were counted in instances, a packed run took
  batch_size rows and its recipe recorded no rows_per_step: it resumes as
  it trained."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  c = _config(3)
  recipe.record(c, str(workdir))
  assert "rows_per_step" not in json.loads(
      (workdir / recipe.RECIPE).read_text())
  assert pretrain.rows_per_step(c, _data_dir(tmp_path, 110, 40),
                                str(workdir), 1) == 32


def test_a_split_without_rows_leaves_the_refusal_to_the_loader(tmp_path):
  """No division by zero here: the loader names an empty split itself."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  assert pretrain.rows_per_step(_config(3), _data_dir(tmp_path, 0, 0),
                                str(workdir), 1) == 32
