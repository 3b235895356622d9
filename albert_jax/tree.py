"""Pytree paths as "a/b/c" strings: the one naming every part of the
package uses for parameters (optimizer masks, non-finite gradient reports,
checkpoint shape checks, parameter tables, checkpoint tensor maps) and for
nested configs ("model.share")."""

from __future__ import annotations

from typing import Any, Callable

import jax


def key_name(key: Any) -> str:
  """One path entry's name: a dict key, a sequence index or an attribute."""
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def path_str(path: tuple, sep: str = "/") -> str:
  """A `jax.tree_util` key path as "a/b/c"."""
  return sep.join(key_name(k) for k in path)


def paths(tree: Any) -> Any:
  """A pytree of "a/b/c" strings with the structure of `tree`."""
  return jax.tree_util.tree_map_with_path(lambda p, _: path_str(p), tree)


def flatten(tree: Any, sep: str = "/",
            is_leaf: Callable[[Any], bool] | None = None) -> dict[str, Any]:
  """{"a/b/c": leaf}, in the tree's leaf order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {path_str(p, sep): leaf for p, leaf in flat}
