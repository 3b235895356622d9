"""Pytree paths as "a/b/c" strings: the one naming every part of the
package uses for parameters (optimizer masks, non-finite gradient reports,
checkpoint shape checks, parameter tables, checkpoint tensor maps) and for
nested configs ("model.share")."""

from __future__ import annotations

from typing import Any, Callable

import jax


def path_str(path: tuple, sep: str = "/") -> str:
  """A `jax.tree_util` key path as "a/b/c" (dict keys, sequence indices and
  attribute names, joined by `sep`)."""
  return jax.tree_util.keystr(path, simple=True, separator=sep)


def paths(tree: Any) -> Any:
  """A pytree of "a/b/c" strings with the structure of `tree`."""
  return jax.tree_util.tree_map_with_path(lambda p, _: path_str(p), tree)


def flatten(tree: Any, sep: str = "/",
            is_leaf: Callable[[Any], bool] | None = None) -> dict[str, Any]:
  """{"a/b/c": leaf}, in the tree's leaf order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {path_str(p, sep): leaf for p, leaf in flat}
