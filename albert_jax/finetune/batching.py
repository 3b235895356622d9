"""Batches of a fine-tuning split's in-memory feature arrays.

Fine-tuning sets fit in host memory once featurised, so batching is indexing.
Training batches are a pure function of (seed, step): each epoch is a fresh
permutation of the rows, and global step s takes rows s·B … s·B+B−1 of the
concatenated epochs (`data.loader.step_positions`, the pre-training
loader's rule too), so a resumed run sees exactly the batches an
uninterrupted one would. Evaluation goes through the rows in order; the last
batch is padded with copies of row 0 whose weight is 0.

Every batch gets "weights" [B] float32 (1 = real row), which the tasks' sums
are weighted by. With a sharding, each process builds only its own rows and
the batch becomes global `jax.Array`s.

`PackedBatches` does the same over packed rows (`config.data.pack`): each
epoch's permutation of the examples is packed afresh, so which examples
share a row changes from epoch to epoch as the composition of an unpacked
batch does, and a step takes the rows that hold `batch_size` examples on
average.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

import jax
import numpy as np

from albert_jax import sharding as sharding_lib
from albert_jax.data import instances as instances_lib
from albert_jax.data import loader as loader_lib
from albert_jax.finetune import packing


def _num_rows(features: dict[str, np.ndarray]) -> int:
  """N, the rows every feature array has; refuses arrays of different
  lengths and an empty split."""
  sizes = {k: v.shape[0] for k, v in features.items()}
  if len(set(sizes.values())) != 1:
    raise ValueError(f"Feature arrays differ in length: {sizes}.")
  n = next(iter(sizes.values()))
  if n == 0:
    raise ValueError("The split has no rows to batch; check the data "
                     "files / TFDS split it was read from.")
  return n


def _local_rows(sharding, batch_size: int):
  """This process's rows of a global batch of `batch_size`."""
  return (slice(0, batch_size) if sharding is None else
          sharding_lib.process_batch_rows(sharding, batch_size))


class _Steps:
  """`iterate` over a subclass's `train_batch(step)`."""

  def iterate(self, start_step: int, num_steps: int
              ) -> Iterator[tuple[int, Any]]:
    """(step, batch) for steps start_step … start_step+num_steps−1."""
    for step in range(start_step, start_step + num_steps):
      yield step, self.train_batch(step)


class ArrayBatches(_Steps):
  """Batches over `features` (name → [N, ...] arrays).

  Args:
    features: the split's arrays, all with leading dim N.
    batch_size: global batch size.
    sharding: where batches go ([B, ...] split over data axes); None keeps
      them as NumPy arrays (tests, single host without jit placement).
    seed: the training shuffle's seed.
  """

  def __init__(self, features: dict[str, np.ndarray], batch_size: int, *,
               sharding: jax.sharding.Sharding | None = None, seed: int = 0):
    self.num_rows = _num_rows(features)
    self.features = features
    self.batch_size = batch_size
    self.sharding = sharding
    self.seed = seed
    self._rows = _local_rows(sharding, batch_size)

  @functools.lru_cache(maxsize=4)
  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(
        self.num_rows)

  def train_rows(self, step: int) -> np.ndarray:
    """Row indices [B] of global training step `step`."""
    positions = loader_lib.step_positions(step, self.batch_size)
    epochs, within = np.divmod(positions, self.num_rows)
    return np.array([self._order(int(e))[w] for e, w in zip(epochs, within)],
                    np.int64)

  def _take(self, rows: np.ndarray, weights: np.ndarray) -> Any:
    local_rows = rows[self._rows]
    local = {k: v[local_rows] for k, v in self.features.items()}
    local["weights"] = weights[self._rows].astype(np.float32)
    return _place(local, self.sharding, self.batch_size)

  def train_batch(self, step: int) -> Any:
    return self._take(self.train_rows(step), np.ones(self.batch_size))


  @property
  def num_eval_batches(self) -> int:
    return -(-self.num_rows // self.batch_size)

  def eval_batches(self) -> Iterator[Any]:
    """All rows in order, the last batch padded (weight 0)."""
    for i in range(self.num_eval_batches):
      rows = np.arange(i * self.batch_size, (i + 1) * self.batch_size)
      real = rows < self.num_rows
      yield self._take(np.where(real, rows, 0), real.astype(np.float32))


def _place(local: dict[str, np.ndarray], sharding, batch_size: int) -> Any:
  """This process's rows of a batch → the global batch (NumPy without a
  sharding)."""
  if sharding is None:
    return local
  return {k: jax.make_array_from_process_local_data(
      sharding, v, (batch_size,) + v.shape[1:]) for k, v in local.items()}


class PackedBatches(_Steps):
  """Training batches of packed rows, a pure function of (seed, step).

  Epoch e packs the examples in the order of permutation (seed, e)
  (`packing.pack`, up to `per_row` a row) and shuffles the rows; the
  epochs' rows follow each other, and global step s takes rows s·R … s·R+R−1 of them, R =
  `instances.rows_per_step` (from epoch 0's packing: the rows that hold
  `batch_size` examples on average, a multiple of `multiple`). Epochs pack
  to slightly different row counts; a resumed run recomputes them.

  Args:
    features: the split's unpacked arrays (`packing.pack`'s input), [N, ...].
    per_row: K, at most this many examples a row.
    batch_size: examples a step should hold, on average.
    sharding: as `ArrayBatches`'.
    seed: the shuffle's seed.
    multiple: R is a multiple of this (data-parallel size × accumulation).
    token_keys: per-token features besides the tokens (`packing.pack`).
  """

  def __init__(self, features: dict[str, np.ndarray], per_row: int,
               batch_size: int, *, sharding=None, seed: int = 0,
               multiple: int = 1, token_keys: tuple[str, ...] = ()):
    self.num_examples = _num_rows(features)
    self.features = features
    self.per_row = per_row
    self.token_keys = tuple(token_keys)
    self.seed = seed
    self.sharding = sharding
    self._rows_so_far = [0]  # rows of the epochs before epoch e, e = index
    first = self._epoch(0)
    self.rows_per_epoch = len(first["input_ids"])
    self.batch_size = instances_lib.rows_per_step(  # rows a step takes
        batch_size, self.num_examples, self.rows_per_epoch, multiple)
    self._local = _local_rows(sharding, self.batch_size)

  @functools.lru_cache(maxsize=2)
  def _epoch(self, epoch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, epoch])
    order = rng.permutation(self.num_examples)
    rows = packing.pack({k: v[order] for k, v in self.features.items()},
                        self.per_row, self.token_keys)
    # Packing puts the longest examples' rows first: shuffled, a step's rows
    # are no longer ordered by length.
    shuffle = rng.permutation(len(rows["input_ids"]))
    return {k: v[shuffle] for k, v in rows.items()}

  def padding_fraction(self) -> float:
    """The share of epoch 0's positions that are padding."""
    return packing.padding_fraction(self._epoch(0))

  def _epoch_start(self, epoch: int) -> int:
    """The first row of `epoch` in the epochs' concatenated rows."""
    while len(self._rows_so_far) <= epoch:
      e = len(self._rows_so_far) - 1
      self._rows_so_far.append(self._rows_so_far[-1] +
                               len(self._epoch(e)["input_ids"]))
    return self._rows_so_far[epoch]

  def train_rows(self, step: int) -> list[tuple[int, np.ndarray]]:
    """Global step `step`'s rows, in order: (epoch, rows of that epoch's
    packing) for each epoch they come from."""
    positions = loader_lib.step_positions(step, self.batch_size)
    position, end = int(positions[0]), int(positions[-1]) + 1
    epoch = 0
    while self._epoch_start(epoch + 1) <= position:
      epoch += 1
    out = []
    while position < end:
      start, stop = self._epoch_start(epoch), self._epoch_start(epoch + 1)
      upto = min(end, stop)
      out.append((epoch, np.arange(position - start, upto - start)))
      position, epoch = upto, epoch + 1
    return out

  def train_batch(self, step: int) -> Any:
    parts = self.train_rows(step)
    glob = {k: np.concatenate([self._epoch(e)[k][rows] for e, rows in parts])
            for k in self._epoch(parts[0][0])}
    local = {k: v[self._local] for k, v in glob.items()}
    local["weights"] = np.ones(len(local["input_ids"]), np.float32)
    return _place(local, self.sharding, self.batch_size)

