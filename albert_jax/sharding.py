"""Device mesh and logical-axis sharding rules, all from configuration.

Every parameter carries logical axis names (`embed`, `heads`, `mlp`, `vocab`,
...) and every key activation an `act_*` name. `config.mesh` names the mesh
axes and their sizes; `config.sharding_rules` maps logical names onto them.
Data parallelism, FSDP and tensor parallelism are then settings, not code:

  data:   mesh [("data", -1)]                     rules: defaults
  FSDP:   mesh [("data", 1), ("fsdp", -1)]        params' `embed` → fsdp
  tensor: mesh [("data", -1), ("tensor", 4)]      heads / mlp / vocab → tensor

A vocabulary that the tensor axis does not divide (BERT's 30522 under
tensor=4) is padded inside the computation (`model.layers.Embed`) and its
table stored whole along the vocabulary (`PADDED_AXES`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, Iterator, Sequence

import flax.linen as nn
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

# Logical axis → mesh axes. Parameter names shard weights (FSDP over `embed`,
# tensor parallelism over heads/mlp/vocab); `act_*` names shard activations.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("act_batch", ("data", "fsdp")),
    ("act_length", None),
    ("act_embed", None),
    ("act_embedding", None),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("embed", "fsdp"),
    ("embed_out", "tensor"),
    ("embedding", None),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("position", None),
    ("token_type", None),
    ("classes", None),
)
DATA_AXES = ("data", "fsdp")
# A run's default `config.mesh`: data parallelism over every device.
DEFAULT_MESH: tuple[tuple[str, int], ...] = (
    ("data", -1), ("fsdp", 1), ("tensor", 1))


_MESH_EXAMPLE = "--config.mesh=\"(('data',-1),('fsdp',1),('tensor',1))\""


def _mesh_axes(axes: Any) -> list[tuple[str, int]]:
  """`config.mesh` as (name, size) pairs, or an error showing the form.

  A command-line override such as `--config.mesh=data` parses without
  complaint into something else, so the form is checked here.
  """
  def pair(entry):
    return (isinstance(entry, (tuple, list)) and len(entry) == 2
            and isinstance(entry[0], str) and entry[0]
            and isinstance(entry[1], (int, np.integer))
            and not isinstance(entry[1], bool))
  if isinstance(axes, (str, bytes)) or not isinstance(axes, Sequence) or (
      not axes) or not all(pair(e) for e in axes):
    raise ValueError(
        "config.mesh must be a non-empty sequence of (axis name, size) "
        f"pairs, size -1 for 'the remaining devices'; got {axes!r}. For "
        f"example {_MESH_EXAMPLE}.")
  return [(name, int(size)) for name, size in axes]


def mesh_shape(axes: Sequence[tuple[str, int]], num_devices: int
               ) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """Resolves one -1 size so that the product equals `num_devices`."""
  axes = _mesh_axes(axes)
  names = tuple(a for a, _ in axes)
  sizes = [s for _, s in axes]
  if len(set(names)) != len(names):
    raise ValueError(f"Mesh axis names repeat: {names}.")
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise ValueError(f"At most one mesh axis may be -1; got {dict(axes)}.")
  fixed = math.prod(s for s in sizes if s != -1)
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"Mesh axis sizes must be positive or -1: {dict(axes)}.")
  if free:
    if num_devices % fixed:
      raise ValueError(
          f"Mesh {dict(axes)} needs a multiple of {fixed} devices; there are "
          f"{num_devices}. Change config.mesh.")
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ValueError(
        f"Mesh {dict(zip(names, sizes))} has {math.prod(sizes)} devices but "
        f"{num_devices} are available; set one axis to -1 or fix the sizes "
        "in config.mesh.")
  return names, tuple(sizes)


def make_mesh(axes: Sequence[tuple[str, int]], devices=None
              ) -> jax.sharding.Mesh:
  """A mesh with Auto axes (sharding by annotation, not by type)."""
  devices = list(devices if devices is not None else jax.devices())
  names, sizes = mesh_shape(axes, len(devices))
  return jax.make_mesh(sizes, names,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(names),
                       devices=devices)


def rules_for(mesh: jax.sharding.Mesh, rules=DEFAULT_RULES
              ) -> tuple[tuple[str, Any], ...]:
  """Drops mesh axes the mesh does not have (a rule may name `tensor` on a
  mesh without one), so one rule set serves every mesh."""
  out = []
  for logical, target in rules:
    if target is None:
      out.append((logical, None))
      continue
    targets = (target,) if isinstance(target, str) else tuple(target)
    kept = tuple(t for t in targets if t in mesh.axis_names)
    out.append((logical,
                kept if len(kept) > 1 else (kept[0] if kept else None)))
  return tuple(out)


def mesh_and_rules(axes: Sequence[tuple[str, int]], rules=DEFAULT_RULES,
                   devices=None
                   ) -> tuple[jax.sharding.Mesh, tuple[tuple[str, Any], ...]]:
  """The mesh of `axes` (`config.mesh`) and `rules` (`config.sharding_rules`,
  as lists or tuples) fitted to it (`rules_for`)."""
  mesh = make_mesh(axes, devices)
  return mesh, rules_for(mesh, [tuple(r) for r in rules])


@contextlib.contextmanager
def in_mesh(mesh: jax.sharding.Mesh, rules) -> Iterator[None]:
  """The mesh and logical-axis rules that jitted code and the model's
  activation constraints (`act_*` names) resolve against while tracing."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def jit_in_mesh(fn: Callable, mesh: jax.sharding.Mesh, rules,
                **jit_kwargs) -> Callable:
  """`jax.jit(fn, **jit_kwargs)`, called (and traced) `in_mesh`.

  The result has `.jitted` (the bare jitted function) and `.lower(*args)`,
  which lowers in the same mesh and rules (so `.compile()` finds the program
  a call compiled).
  """
  jitted = jax.jit(fn, **jit_kwargs)

  @functools.wraps(fn)
  def run(*args):
    with in_mesh(mesh, rules):
      return jitted(*args)

  def lower(*args):
    with in_mesh(mesh, rules):
      return jitted.lower(*args)
  run.jitted = jitted
  run.lower = lower
  return run


# Logical parameter axes that the model pads at compute time when the mesh
# does not divide them (`layers.Embed`: the vocabulary): stored whole along
# that axis rather than split unevenly, which jit refuses.
PADDED_AXES = ("vocab",)


def _divisible(path, box, sharding: NamedSharding, mesh) -> NamedSharding:
  """`sharding` for the boxed abstract parameter `box`, with every mesh
  split checked against the dimension it splits (see PADDED_AXES)."""
  shape, names = box.value.shape, box.names
  spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
  for dim, axes in enumerate(spec):
    if axes is None:
      continue
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    parts = math.prod(mesh.shape[a] for a in axes)
    if shape[dim] % parts == 0:
      continue
    if names[dim] in PADDED_AXES:
      spec[dim] = None
      continue
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    raise ValueError(
        f"Parameter {name} has {shape[dim]} entries along its "
        f"{names[dim]!r} axis, which mesh axes {axes} ({parts} devices) "
        f"cannot split evenly; change config.mesh, or map {names[dim]!r} to "
        "None in config.sharding_rules.")
  return NamedSharding(mesh, P(*spec))


def logical_shardings(abstract_boxed: Any, mesh, rules) -> Any:
  """NamedShardings for a boxed (LogicallyPartitioned) pytree.

  A dimension the mesh would split unevenly is stored whole if the model
  pads it in the computation (PADDED_AXES: the vocabulary); any other is
  refused with a ValueError naming the parameter.
  """
  specs = nn.get_partition_spec(abstract_boxed)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
  return jax.tree_util.tree_map_with_path(
      lambda path, box, s: _divisible(path, box, s, mesh) if is_box(box)
      else s, abstract_boxed, shardings, is_leaf=is_box)


def state_shardings(tx: optax.GradientTransformation, abstract_state: Any,
                    param_shardings: Any, mesh) -> Any:
  """Shardings for {"params", "opt_state", ...}: optimizer slots follow their
  parameter; counters and other scalars are replicated."""
  replicated = NamedSharding(mesh, P())
  opt = optax.tree_map_params(
      tx, lambda _, s: s, abstract_state["opt_state"], param_shardings,
      transform_non_params=lambda _: replicated)
  out = {k: jax.tree.map(lambda _: replicated, v)
         for k, v in abstract_state.items()}
  out["params"] = param_shardings
  out["opt_state"] = opt
  return out


def data_sharding(mesh) -> NamedSharding:
  """[batch, ...] arrays split over the data-parallel axes."""
  axes = tuple(a for a in DATA_AXES if a in mesh.axis_names)
  return NamedSharding(mesh, P(axes if axes else None))


def data_parallel_size(mesh) -> int:
  return int(np.prod([mesh.shape[a] for a in DATA_AXES
                      if a in mesh.axis_names]))


def process_batch_rows(sharding: jax.sharding.Sharding,
                       global_batch_size: int) -> slice:
  """The rows of a [global_batch_size, ...] batch that this process's
  devices hold under `sharding`: the part of every global batch this process
  must load (for `jax.make_array_from_process_local_data`).

  With the data axes outermost in the mesh and no model axis spanning
  processes, process p of n gets rows [p·B/n, (p+1)·B/n).

  Raises:
    ValueError: if the rows are not one contiguous range.
  """
  shape = (global_batch_size,)
  rows = set()
  for index in sharding.addressable_devices_indices_map(shape).values():
    rows.update(range(*index[0].indices(global_batch_size)))
  start, stop = min(rows), max(rows) + 1
  if len(rows) != stop - start:
    raise ValueError(
        f"This process's devices hold batch rows {sorted(rows)}, not one "
        "contiguous range; order the mesh axes so the data axes come first.")
  return slice(start, stop)
