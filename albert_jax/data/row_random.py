"""Random numbers keyed per row, with no state: masking's source of randomness.

Every value is a pure function of (row key, stream, counter) through the
splitmix64 finaliser, so a row's draws do not depend on the batch it lands
in or on how many values are drawn (static masking and bitwise resume rest
on this), and a prefix of a row's counters can be drawn on its own.
`row_keys` derives the row keys from (seed, epoch, record index).
"""

from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd


def mix(x: np.ndarray) -> np.ndarray:
  """splitmix64 finaliser: a bijective, well-mixed uint64 → uint64 hash."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def mix_inplace(x: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
  """`mix` on an owned uint64 array, overwriting it; `t`: scratch space of
  x's shape (allocated if None)."""
  t = np.right_shift(x, np.uint64(30), out=t)
  x ^= t
  x *= np.uint64(0xBF58476D1CE4E5B9)
  np.right_shift(x, np.uint64(27), out=t)
  x ^= t
  x *= np.uint64(0x94D049BB133111EB)
  np.right_shift(x, np.uint64(31), out=t)
  x ^= t
  return x


def row_base(keys: np.ndarray, stream: int) -> np.ndarray:
  """Per-row seeds of one random stream: [B] uint64."""
  with np.errstate(over="ignore"):
    return mix(np.asarray(keys).astype(np.uint64) * GOLDEN
                + np.uint64(stream))


def bits53(base: np.ndarray, counters: np.ndarray) -> np.ndarray:
  """53 random bits per (row, counter): `base` ([B] or [B, 1], from
  `row_base`) broadcast against `counters` (uint64 flat indices in a row)."""
  with np.errstate(over="ignore"):
    x = mix_inplace(base + (counters + np.uint64(1)) * GOLDEN)
  x >>= np.uint64(11)
  return x


def to_unit(bits53: np.ndarray) -> np.ndarray:
  """53 random bits → a float64 in [0, 1) (exact)."""
  return bits53.astype(np.float64) * (1.0 / (1 << 53))


def uniform(keys: np.ndarray, stream: int, shape: tuple[int, ...]
             ) -> np.ndarray:
  """Uniform [0, 1) floats of `shape` = (B, ...) from per-row uint64 keys.

  Element (b, *i) depends only on keys[b], `stream` and the flat index of i
  within shape[1:], so a prefix of columns can be drawn on its own.
  """
  counters = np.arange(int(np.prod(shape[1:], dtype=np.int64)),
                       dtype=np.uint64).reshape(shape[1:])
  base = row_base(keys, stream)
  return to_unit(bits53(base.reshape((-1,) + (1,) * (len(shape) - 1)),
                          counters))


def row_keys(seed: int, epoch, indices: np.ndarray) -> np.ndarray:
  """Per-instance uint64 keys from (seed, epoch, record index).

  `epoch` is an int or an array broadcastable to `indices`; static masking
  passes 0 for every epoch.
  """
  with np.errstate(over="ignore"):
    k = mix(np.uint64(seed) * GOLDEN + np.uint64(0x632BE59BD9B4E019))
    k = mix(k + np.asarray(epoch, np.uint64) * GOLDEN)
    return mix(k + (np.asarray(indices, np.uint64) + np.uint64(1)) * GOLDEN)
