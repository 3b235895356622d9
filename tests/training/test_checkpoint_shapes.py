"""Comparing a checkpoint's stored shapes with a model's, exact cases."""

import numpy as np

from albert_jax.training import checkpoint_shapes as shapes


def test_target_shapes_names_paths_as_orbax_does():
  tree = {"params": {"w": np.zeros((2, 3))}, "opt_state": [
      {"mu": np.zeros(4)}, np.zeros(())]}
  assert shapes.target_shapes(tree) == {
      "params/w": (2, 3), "opt_state/0/mu": (4,), "opt_state/1": ()}


def test_shape_problems_and_partial_restore():
  stored = {"params/w": (2, 3), "params/b": (3,), "opt_state/mu": (2, 3)}
  wanted = {"params/w": (2, 4), "params/new": (1,)}
  # Whole state: every difference, the extra stored arrays too.
  assert shapes.shape_problems(stored, wanted) == [
      ("opt_state/mu", (2, 3), None), ("params/b", (3,), None),
      ("params/new", None, (1,)), ("params/w", (2, 3), (2, 4))]
  # Partial (params only): arrays stored elsewhere are not the model's concern.
  assert shapes.shape_problems(stored, wanted, extra_under=["params"]) == [
      ("params/b", (3,), None), ("params/new", None, (1,)),
      ("params/w", (2, 3), (2, 4))]
  assert shapes.shape_problems(stored, stored) == []


def test_shape_error_lists_parameters_first():
  problems = [("opt_state/mu/w", (2, 3), (2, 4)), ("params/w", (2, 3), (2, 4)),
              ("params/new", None, (1,)), ("params/old", (5,), None)]
  error = shapes.shape_error("/ckpt", 7, problems)
  assert isinstance(error, ValueError) and error.step == 7
  lines = str(error).splitlines()
  assert lines[0] == (
      "Checkpoint step 7 in /ckpt was written by a model of another shape "
      "(or with other heads / optimizer); 4 mismatched arrays (3 "
      "parameters):")
  assert lines[1:5] == [
      "  params/new: missing from the checkpoint (model (1,))",
      "  params/old: in the checkpoint (5,), not in the model",
      "  params/w: checkpoint (2, 3), model (2, 4)",
      "  opt_state/mu/w: checkpoint (2, 3), model (2, 4)"]
  assert lines[-1] == ("Use the config the checkpoint was written with, or a "
                       "new workdir.")
