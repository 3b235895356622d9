"""Where a task of a TFDS dataset (GLUE, RACE, SQuAD, CoNLL-2003) reads it.

Every such task takes the same two `config.data` keys, read here once with
their defaults:
  tfds_data_dir (None): the TFDS data directory, local or gs:// (None:
    TFDS's default, ~/tensorflow_datasets).
  tfds_download (True): let TFDS download and prepare a dataset missing
    there; False reads only what is prepared (a TPU slice's workers, tests).
TensorFlow is imported when a dataset is first opened, not before.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

from albert_jax import storage


@dataclasses.dataclass(frozen=True)
class TfdsSource:
  """`config.data`'s TFDS settings (see the module docstring)."""
  data_dir: str | None = None
  download: bool = True

  @classmethod
  def from_data(cls, data) -> "TfdsSource":
    """The settings of a task's `config.data` (a ConfigDict or a dict)."""
    data_dir = data.get("tfds_data_dir", None)
    return cls(storage.as_str(data_dir) if data_dir else None,
               bool(data.get("tfds_download", True)))

  def builder(self, name: str):
    """TFDS's builder of dataset `name` ("glue/mrpc"): its description
    (features, label names) without reading or downloading data."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    return tfds.builder(name, data_dir=self.data_dir)

  def examples(self, name: str, split: str, batch: int | None = None,
               check: Callable[[Any], None] | None = None) -> Iterator[Any]:
    """Split `split` of dataset `name` as NumPy examples, in file order
    (or batches of `batch`), prepared first where `download` allows.
    `check` is given the builder's info before any data is read."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    builder = self.builder(name)
    if check is not None:
      check(builder.info)
    if self.download:
      builder.download_and_prepare()
    ds = builder.as_dataset(split=split, shuffle_files=False)
    return tfds.as_numpy(ds.batch(batch) if batch else ds)
