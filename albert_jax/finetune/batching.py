"""Batches of a fine-tuning split's in-memory feature arrays.

Fine-tuning sets fit in host memory once featurised, so batching is indexing.
Training batches are a pure function of (seed, step): each epoch is a fresh
permutation of the rows, and global step s takes rows s·B … s·B+B−1 of the
concatenated epochs, so a resumed run sees exactly the batches an
uninterrupted one would. Evaluation goes through the rows in order; the last
batch is padded with copies of row 0 whose weight is 0.

Every batch gets "weights" [B] float32 (1 = real row), which the tasks' sums
are weighted by. With a sharding, each process builds only its own rows and
the batch becomes global `jax.Array`s.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

import jax
import numpy as np

from albert_jax import sharding as sharding_lib


class ArrayBatches:
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
    sizes = {k: v.shape[0] for k, v in features.items()}
    if len(set(sizes.values())) != 1:
      raise ValueError(f"Feature arrays differ in length: {sizes}.")
    self.num_rows = next(iter(sizes.values()))
    if self.num_rows == 0:
      raise ValueError("The split has no rows to batch; check the data "
                       "files / TFDS split it was read from.")
    self.features = features
    self.batch_size = batch_size
    self.sharding = sharding
    self.seed = seed
    self._rows = (slice(0, batch_size) if sharding is None else
                  sharding_lib.process_batch_rows(sharding, batch_size))

  @functools.lru_cache(maxsize=4)
  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(
        self.num_rows)

  def train_rows(self, step: int) -> np.ndarray:
    """Row indices [B] of global training step `step`."""
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    positions = step * self.batch_size + np.arange(self.batch_size)
    epochs, within = np.divmod(positions, self.num_rows)
    return np.array([self._order(int(e))[w] for e, w in zip(epochs, within)],
                    np.int64)

  def _take(self, rows: np.ndarray, weights: np.ndarray) -> Any:
    local_rows = rows[self._rows]
    local = {k: v[local_rows] for k, v in self.features.items()}
    local["weights"] = weights[self._rows].astype(np.float32)
    if self.sharding is None:
      return local
    return {k: jax.make_array_from_process_local_data(
        self.sharding, v, (self.batch_size,) + v.shape[1:])
            for k, v in local.items()}

  def train_batch(self, step: int) -> Any:
    return self._take(self.train_rows(step), np.ones(self.batch_size))

  def iterate(self, start_step: int, num_steps: int
              ) -> Iterator[tuple[int, Any]]:
    """(step, batch) for steps start_step … start_step+num_steps−1."""
    for step in range(start_step, start_step + num_steps):
      yield step, self.train_batch(step)

  @property
  def num_eval_batches(self) -> int:
    return -(-self.num_rows // self.batch_size)

  def eval_batches(self) -> Iterator[Any]:
    """All rows in order, the last batch padded (weight 0)."""
    for i in range(self.num_eval_batches):
      rows = np.arange(i * self.batch_size, (i + 1) * self.batch_size)
      real = rows < self.num_rows
      yield self._take(np.where(real, rows, 0), real.astype(np.float32))
