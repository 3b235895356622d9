"""A checkpoint's stored array shapes against a model's, before restoring.

Orbax restoring into a model of another shape fails deep in tensorstore, or
silently for a partial restore; reading the stored shapes from the
checkpoint's metadata first lets the error name every mismatched array
(parameters first) and say what to do.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import orbax.checkpoint as ocp

from albert_jax import tree as tree_lib


class CheckpointShapeError(ValueError):
  """A checkpoint whose parameter shapes disagree with the model config.

  Attributes:
    step: the checkpoint's step.
    problems: (path, checkpoint shape or None, model shape or None) for every
      mismatched array; None where one side lacks the path.
  """

  def __init__(self, message: str, step: int,
               problems: Sequence[tuple[str, Any, Any]]):
    super().__init__(message)
    self.step = step
    self.problems = list(problems)



def target_shapes(tree) -> dict[str, tuple[int, ...]]:
  """"a/b/0/c" → shape for every array leaf, in orbax's path naming."""
  return {k: tuple(np.shape(v)) for k, v in tree_lib.flatten(tree).items()}


def stored_shapes(mngr: ocp.CheckpointManager, step: int
                   ) -> dict[str, tuple[int, ...]]:
  """The state's array shapes as saved, read from the checkpoint metadata.

  Orbax stores tuples and lists as lists and named tuples (optax states) as
  dicts of their fields, which `target_shapes` names the same way.
  """
  meta = mngr.item_metadata(step)["state"]
  tree = getattr(meta, "tree", meta)
  if tree is None:
    raise ValueError(f"checkpoint step {step} has no state metadata")
  flat = {}

  def walk(node, prefix):
    if isinstance(node, Mapping):
      items = node.items()
    elif isinstance(node, (list, tuple)):
      items = enumerate(node)
    else:
      if hasattr(node, "shape"):
        flat[prefix] = tuple(node.shape)
      return
    for k, v in items:
      walk(v, f"{prefix}/{k}" if prefix else str(k))
  walk(tree, "")
  return flat


def shape_problems(stored: Mapping[str, tuple[int, ...]],
                    wanted: Mapping[str, tuple[int, ...]],
                    extra_under: Sequence[str] | None = None):
  """Mismatches as (path, stored shape or None, wanted shape or None).

  A stored array the target lacks counts only under `extra_under` prefixes
  (all of them when None): a partial restore ignores the rest.
  """
  problems = []
  for key, shape in wanted.items():
    if stored.get(key) != shape:
      problems.append((key, stored.get(key), shape))
  for key, shape in stored.items():
    if key in wanted:
      continue
    if extra_under is None or any(key == p or key.startswith(p + "/")
                                  for p in extra_under):
      problems.append((key, shape, None))
  return sorted(problems)


def shape_error(directory, step: int, problems) -> CheckpointShapeError:
  # Parameters first: optimizer slots mirror them and say nothing new.
  problems = sorted(problems, key=lambda p: (not p[0].startswith("params/"),
                                             p[0]))
  num_params = sum(p[0].startswith("params/") for p in problems)
  lines = []
  for key, stored, wanted in problems[:30]:
    if stored is None:
      lines.append(f"  {key}: missing from the checkpoint (model {wanted})")
    elif wanted is None:
      lines.append(f"  {key}: in the checkpoint {stored}, not in the model")
    else:
      lines.append(f"  {key}: checkpoint {stored}, model {wanted}")
  if len(problems) > 30:
    lines.append(f"  ... and {len(problems) - 30} more")
  return CheckpointShapeError(
      f"Checkpoint step {step} in {directory} was written by a model of "
      "another shape (or with other heads / optimizer); "
      f"{len(problems)} mismatched arrays ({num_params} parameters):\n"
      + "\n".join(lines) + "\nUse the config the checkpoint was written "
      "with, or a new workdir.", step, problems)
