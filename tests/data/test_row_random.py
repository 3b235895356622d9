"""The per-row random numbers masking draws from: the hash against a plain
integer splitmix64, keys pinned (a change would re-mask every resumed
run), and a row's draws independent of its batch and of how many are
drawn."""

from hypothesis import given
from hypothesis import strategies as st
import numpy as np

from albert_jax.data import row_random

M64 = (1 << 64) - 1


def splitmix64_finaliser(x: int) -> int:
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
  return x ^ (x >> 31)


@given(st.lists(st.integers(0, M64), min_size=1, max_size=20))
def test_mix_is_splitmix64(values):
  x = np.array(values, np.uint64)
  want = [splitmix64_finaliser(v) for v in values]
  with np.errstate(over="ignore"):
    assert [int(v) for v in row_random.mix(x)] == want
    assert [int(v) for v in row_random.mix_inplace(x.copy())] == want


def test_row_keys_pinned():
  assert [int(k) for k in row_random.row_keys(0, 0, np.arange(3))] == [
      9453489454682472753, 15152312095832873939, 6077091963471831553]
  # An epoch array gives each row its own epoch's key.
  per_row = row_random.row_keys(3, np.array([0, 1]), np.array([5, 5]))
  assert per_row[0] == row_random.row_keys(3, 0, [5])[0]
  assert per_row[1] == row_random.row_keys(3, 1, [5])[0]
  assert per_row[0] != per_row[1]


def test_uniform_pinned_and_in_range():
  keys = row_random.row_keys(0, 0, np.arange(3))
  np.testing.assert_array_equal(row_random.uniform(keys, 1, (3, 2)), [
      [0.15728493336910876, 0.3440401856214913],
      [0.7348541180399917, 0.36141453654885247],
      [0.20694526970648164, 0.2399814917279851]])
  u = row_random.uniform(row_random.row_keys(1, 0, np.arange(64)), 2,
                         (64, 500))
  assert u.min() >= 0.0 and u.max() < 1.0
  assert abs(u.mean() - 0.5) < 0.01  # 32,000 draws: SE 0.0016


@given(st.integers(0, 2**32), st.integers(1, 6), st.integers(1, 9),
       st.integers(0, 4))
def test_a_rows_draws_depend_on_its_key_alone(seed, rows, width, stream):
  keys = row_random.row_keys(seed, 0, np.arange(rows))
  full = row_random.uniform(keys, stream, (rows, width))
  for b in range(rows):  # the same row drawn alone
    np.testing.assert_array_equal(
        row_random.uniform(keys[b:b + 1], stream, (1, width))[0], full[b])
  # A prefix of the counters drawn on its own.
  np.testing.assert_array_equal(
      row_random.uniform(keys, stream, (rows, 1))[:, 0], full[:, 0])
  other = row_random.uniform(keys, stream + 1, (rows, width))
  assert not np.array_equal(other, full)
