"""Tensor tables: one list of entries drives loading, saving and shape errors.

An `Entry` names one checkpoint tensor, the albert_jax parameter it holds (a
path into the `Albert` tree, plus the copy index for a stacked layer
parameter), the shape the config implies for it in the checkpoint, and how
its layout differs from ours (`kind`). Reading and writing walk the same
list, so they are inverse by construction, and a checkpoint is validated
against the list before a single array is converted.

Our layouts: dense kernels [in, out]; attention projections [H, heads,
head_dim] and the attention output [heads, head_dim, H], so tensor
parallelism can split heads; layer parameters stacked on a leading copy axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from albert_jax import tree as tree_lib
from albert_jax.interop import CheckpointError

Params = dict[str, Any]

# kind → (checkpoint array, heads) → our array. torch Linear weights are
# [out, in]; TF kernels are already [in, out] but flat over heads.
_TO_PARAM: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "same": lambda a, n: a,
    "transpose": lambda a, n: a.T,
    "heads_in": lambda a, n: a.T.reshape(a.shape[1], n, -1),
    "heads_bias": lambda a, n: a.reshape(n, -1),
    "heads_out": lambda a, n: a.T.reshape(n, -1, a.shape[0]),
    "tf_heads_in": lambda a, n: a.reshape(a.shape[0], n, -1),
    "tf_heads_out": lambda a, n: a.reshape(n, -1, a.shape[1]),
}
# kind → our array → checkpoint array (the inverse of _TO_PARAM).
_FROM_PARAM: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "same": lambda x: x,
    "transpose": lambda x: x.T,
    "heads_in": lambda x: x.reshape(x.shape[0], -1).T,
    "heads_bias": lambda x: x.reshape(-1),
    "heads_out": lambda x: x.reshape(-1, x.shape[-1]).T,
    "tf_heads_in": lambda x: x.reshape(x.shape[0], -1),
    "tf_heads_out": lambda x: x.reshape(-1, x.shape[-1]),
}
# Kinds whose checkpoint array is a torch Linear weight, [out, in].
_TORCH_LAYOUT = frozenset({"transpose", "heads_in", "heads_out"})


@dataclasses.dataclass(frozen=True)
class Entry:
  """One checkpoint tensor and the parameter it holds.

  Attributes:
    name: the tensor's name in the checkpoint.
    path: keys into the albert_jax parameter tree.
    shape: the tensor's shape in the checkpoint that the config implies.
    kind: layout conversion, a key of `_TO_PARAM`.
    copy: for a stacked layer parameter, its index on the copy axis.
  """
  name: str
  path: tuple[str, ...]
  shape: tuple[int, ...]
  kind: str = "same"
  copy: int | None = None


class Table:
  """Builds a list of entries; `dense` and `layer_norm` add a pair at once.

  The constructor takes the checkpoint's naming: torch's weight/bias and
  "." (the defaults), or TF's kernel/bias, gamma/beta and "/".
  """

  def __init__(self, weight: str = "weight", bias: str = "bias",
               scale: str = "weight", shift: str = "bias", sep: str = "."):
    self.entries: list[Entry] = []
    self._names = dict(weight=weight, bias=bias, scale=scale, shift=shift)
    self._sep = sep

  def add(self, name, path, shape, kind="same", copy=None):
    self.entries.append(Entry(name, tuple(path), tuple(shape), kind, copy))

  def dense(self, name, path, n_in, n_out, kind="transpose",
            bias_kind="same", copy=None):
    """A dense layer's weight ([out, in] in torch, [in, out] in TF) and bias."""
    shape = (n_out, n_in) if kind in _TORCH_LAYOUT else (n_in, n_out)
    sep, names = self._sep, self._names
    self.add(name + sep + names["weight"], (*path, "kernel"), shape, kind,
             copy)
    self.add(name + sep + names["bias"], (*path, "bias"), (n_out,),
             bias_kind, copy)

  def layer_norm(self, name, path, n, copy=None):
    sep, names = self._sep, self._names
    self.add(name + sep + names["scale"], (*path, "scale"), (n,), copy=copy)
    self.add(name + sep + names["shift"], (*path, "bias"), (n,), copy=copy)


def check(shapes: Mapping[str, tuple[int, ...]], entries: Iterable[Entry],
          header: str, ignore: Callable[[str], bool] = lambda name: False,
          ) -> None:
  """Raises ValueError listing every tensor that does not fit `entries`.

  Args:
    shapes: the checkpoint's tensor name → shape.
    entries: the tensors the config expects, in model order.
    header: what did not fit, e.g. "the weights do not fit config.json (...)".
    ignore: names that may be present without an entry (buffers, tied
      copies, optimizer slots).

  Each line names the tensor and both shapes: missing tensors, tensors the
  config has no place for (e.g. a group beyond `num_hidden_groups`), and
  tensors of the wrong shape, in model order and then the extras sorted.
  """
  want = {e.name: e.shape for e in entries}
  problems = []
  for key in [*want, *sorted(k for k in shapes if k not in want)]:
    if key in want and key not in shapes:
      problems.append(f"  {key}: missing (config expects {want[key]})")
    elif key not in want:
      if ignore(key):
        continue
      problems.append(f"  {key}: unexpected {tuple(shapes[key])} "
                      "(config has no place for it)")
    elif tuple(shapes[key]) != want[key]:
      problems.append(f"  {key}: checkpoint {tuple(shapes[key])}, "
                      f"config expects {want[key]}")
  if problems:
    shown = problems[:40]
    if len(problems) > 40:
      shown.append(f"  ... and {len(problems) - 40} more")
    raise ValueError(header + "; mismatched tensors:\n" + "\n".join(shown))


def assemble(entries: Iterable[Entry], get: Callable[[str], np.ndarray],
             heads: int) -> Params:
  """The parameter tree from checkpoint tensors (`get(name)` → array).

  Stacked entries are stacked in copy order; the caller has checked shapes.
  """
  tree: Params = {}
  stacks: dict[tuple[str, ...], dict[int, np.ndarray]] = {}
  for e in entries:
    value = _TO_PARAM[e.kind](np.asarray(get(e.name)), heads)
    if e.copy is None:
      _set(tree, e.path, value)
    else:
      stacks.setdefault(e.path, {})[e.copy] = value
  for path, copies in stacks.items():
    _set(tree, path, np.stack([copies[i] for i in range(len(copies))]))
  return tree


def disassemble(params: Params, entries: Iterable[Entry]
                ) -> dict[str, np.ndarray]:
  """Checkpoint name → contiguous array, the inverse of `assemble`."""
  out = {}
  for e in entries:
    value = np.asarray(_get(params, e.path))
    if e.copy is not None:
      value = value[e.copy]
    out[e.name] = np.ascontiguousarray(_FROM_PARAM[e.kind](value))
  return out


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def check_shapes(params, expected, what: str) -> None:
  """Raises CheckpointError listing every path whose shape differs."""
  flat_got = tree_lib.flatten(params)
  flat_want = tree_lib.flatten(expected)
  problems = []
  for key in sorted(set(flat_got) | set(flat_want)):
    got, want = flat_got.get(key), flat_want.get(key)
    if got is None:
      problems.append(f"  {key}: missing (model expects {tuple(want.shape)})")
    elif want is None:
      problems.append(f"  {key}: unexpected {tuple(np.shape(got))}")
    elif tuple(np.shape(got)) != tuple(want.shape):
      problems.append(f"  {key}: checkpoint {tuple(np.shape(got))}, model "
                      f"{tuple(want.shape)}")
  if problems:
    raise CheckpointError(
        f"{what} does not fit the model config; mismatched parameters:\n"
        + "\n".join(problems[:30])
        + (f"\n  ... and {len(problems) - 30} more" if len(problems) > 30
           else ""))
