"""Ahead-of-time compile of the train step: will this config fit?

  python -m albert_jax.main --config=configs/albert_xxlarge.py \
      --compile_only --num_fake_devices=64 --config.model.remat=full \
      --config.accumulation_steps=4 --config.model.dtype=bfloat16

Builds the abstract train state and batch for the config's mesh, lowers and
compiles the sharded train step without allocating anything, and prints
`compiled.memory_analysis()` per device: the parameter + optimizer state the
step takes in, its outputs, and the temporaries it needs, and whether their
sum fits a device of a given size (`report(config, device_memory_gib=32)`,
or the environment variable `ALBERT_JAX_DEVICE_MEMORY_GIB`). Other meshes:
`--config.mesh="(('data', 1), ('fsdp', -1))"` (ml-collections parses a tuple
field from the command line, not a list); `parse_mesh` also reads the string
form "data:1,fsdp:-1".

With fake CPU devices the numbers are those of XLA:CPU's buffer assignment
for the same sharded (SPMD-partitioned) program. The state and batch sizes
per device are exact; the temporaries (activations kept for the backward
pass, gradients, collective buffers, workspace) are XLA:CPU's estimate of
what an accelerator needs. An accelerator's compiler fuses and schedules
differently (XLA:CPU's own two schedulers differ by up to ~12% on these
programs), so read them to within some tens of percent, not to the byte.

Two things differ from a plain `.compile()`, both because only the buffer
assignment is wanted: the LLVM back end runs at its cheapest settings
(`loop.FAST_COMPILE_OPTIONS`: ~6x faster, same buffers), and on CPU a bfloat16
model is compiled as float16 (`BF16_STAND_IN`: same sizes; XLA:CPU would
widen bfloat16 buffers to float32).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax import sharding as sharding_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import loop
from albert_jax.training import optimizer as optim
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

GIB = 1024 ** 3
DEFAULT_HEADROOM = 0.10
DEVICE_MEMORY_ENV = "ALBERT_JAX_DEVICE_MEMORY_GIB"

# loop.FAST_COMPILE_OPTIONS change how fast XLA:CPU emits machine code, not
# which buffers it assigns (ALBERT-xxlarge's train step on 64 devices: 8 s
# instead of 50 s, the same bytes; configs/tiny.py's moves by < 0.1%).
# XLA:CPU has no bfloat16 arithmetic: its float normalisation widens bfloat16
# ops to float32, and with them the buffers they write, so a bfloat16 model
# compiled for CPU reports nearly its float32 footprint (ALBERT-base at 64
# sequences of 512 per device: 61.8 GiB of temporaries in bfloat16, 63.6 in
# float32, 41.2 in float16). float16 it keeps in 16 bits, and the program is
# otherwise the same (LayerNorm, softmax and the losses run in float32
# either way), so on CPU a bfloat16 dtype is compiled as float16: same bytes
# as bfloat16 on an accelerator.
BF16_STAND_IN = "float16"


def parse_mesh(mesh: Any) -> tuple[tuple[str, int], ...]:
  """config.mesh as ((name, size), ...).

  Accepts the config's sequence of pairs, or the string form
  "data:16,fsdp:4" (also "data=16,fsdp=4"; -1 takes the remaining devices).
  """
  if isinstance(mesh, str):
    axes = []
    for item in mesh.split(","):
      item = item.strip()
      if not item:
        continue
      name, sep, size = item.replace("=", ":").partition(":")
      if not sep:
        raise ValueError(f"Mesh axis {item!r} needs a size, as in "
                         f"'data:16,fsdp:4'; got mesh {mesh!r}.")
      axes.append((name.strip(), int(size)))
    return tuple(axes)
  return tuple((str(name), int(size)) for name, size in mesh)


def abstract_batch(shapes: dict[str, tuple[tuple[int, ...], Any]], sharding
                   ) -> dict[str, jax.ShapeDtypeStruct]:
  """A `RunSpec.batch_schema` as sharded abstract arrays."""
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
          for k, (shape, dtype) in shapes.items()}


def bytes_per_device(tree) -> int:
  """Bytes one device holds of a tree of sharded abstract arrays."""
  total = 0
  for x in jax.tree.leaves(tree):
    try:
      shape = x.sharding.shard_shape(x.shape)
    except ValueError:  # uneven: XLA pads every shard to the largest
      spec = x.sharding.spec
      shape = list(x.shape)
      for dim, axes in enumerate(spec):
        if axes is None:
          continue
        axes = (axes,) if isinstance(axes, str) else axes
        parts = math.prod(x.sharding.mesh.shape[a] for a in axes)
        shape[dim] = -(-shape[dim] // parts)
    total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return total


@dataclasses.dataclass
class Compiled:
  """What `compile_train_step` built, for reports and tests."""
  compiled: Any
  mesh: jax.sharding.Mesh
  state: dict  # abstract, sharded
  batch: dict  # abstract, sharded
  lower_seconds: float
  compile_seconds: float
  bf16_as_float16: bool  # compiled bfloat16 as float16 (CPU)


def compile_train_step(config, *, fast: bool = True,
                       stand_in_16bit: bool = True) -> Compiled:
  """Lowers and compiles the config's sharded train step; allocates nothing.

  Args:
    config: a full pre-training config (config_lib.base_config).
    fast: compile with `loop.FAST_COMPILE_OPTIONS` on CPU (same buffers, cheaper
      code generation).
    stand_in_16bit: on CPU, compile bfloat16 as float16 (see
      `BF16_STAND_IN`).
  """
  mesh = sharding_lib.make_mesh(parse_mesh(config.mesh))
  rules = sharding_lib.rules_for(
      mesh, [tuple(r) for r in config.sharding_rules])
  data_parallel = sharding_lib.data_parallel_size(mesh)
  b, acc = config.batch_size, config.accumulation_steps
  if b % (data_parallel * acc):
    raise ValueError(
        f"batch_size {b} must be divisible by the data-parallel size "
        f"({data_parallel}) × accumulation_steps ({acc}).")
  model_values = dict(config.model)
  platform = mesh.devices.flat[0].platform
  stand_in = False
  for key in ("dtype", "param_dtype"):
    if (platform == "cpu" and stand_in_16bit
        and model_values[key] == "bfloat16"):
      model_values[key] = BF16_STAND_IN
      stand_in = True
  spec = run_spec.run_spec(config, ModelConfig.from_dict(model_values))
  tx, schedule = optim.make(config)
  start = time.perf_counter()
  init = state_lib.state_init_fn(spec.init_params, tx)
  abstract_boxed = jax.eval_shape(init, jax.random.key(0))
  shardings = state_lib.state_shardings(abstract_boxed, tx, mesh, rules)
  abstract = {**abstract_boxed,
              "params": nn.meta.unbox(abstract_boxed["params"])}
  state = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract, shardings)
  batch = abstract_batch(spec.batch_schema,
                         sharding_lib.data_sharding(mesh))
  step = step_lib.make_train_step(spec.objective, tx, schedule, acc)
  jitted = step_lib.jit_train_step(step, shardings, mesh, rules).jitted
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    lowered = jitted.lower(state, batch)
  lower_seconds = time.perf_counter() - start
  options = None
  if fast and platform == "cpu":
    options = dict(loop.FAST_COMPILE_OPTIONS)
  start = time.perf_counter()
  compiled = lowered.compile(compiler_options=options)
  return Compiled(compiled, mesh, state, batch, lower_seconds,
                  time.perf_counter() - start, stand_in)


def memory(compiled) -> dict[str, int]:
  """Per-device bytes from XLA's memory analysis.

  `total` is the peak the step needs: its inputs, its outputs that do not
  reuse a donated input buffer, and its temporaries.
  """
  m = compiled.memory_analysis()
  out = {
      "arguments": m.argument_size_in_bytes,
      "outputs": m.output_size_in_bytes,
      "aliased": m.alias_size_in_bytes,
      "temporaries": m.temp_size_in_bytes,
      "generated_code": m.generated_code_size_in_bytes,
  }
  # Donated state is aliased to the outputs, so it counts once.
  out["total"] = (out["arguments"] + out["outputs"] - out["aliased"]
                  + out["temporaries"])
  return out


def budget(device_memory_gib: float | None,
           headroom: float = DEFAULT_HEADROOM) -> float | None:
  """Usable bytes of a device of `device_memory_gib` GiB, less headroom."""
  if device_memory_gib is None:
    return None
  return device_memory_gib * GIB * (1.0 - headroom)


def fits(total_bytes: float, device_memory_gib: float | None,
         headroom: float = DEFAULT_HEADROOM) -> bool | None:
  """Whether `total_bytes` fit in the device less headroom (None: no size)."""
  usable = budget(device_memory_gib, headroom)
  return None if usable is None else total_bytes <= usable


def analyse(config, *, fast: bool = True) -> dict[str, Any]:
  """Compiles the config's train step; per-device bytes and context."""
  built = compile_train_step(config, fast=fast)
  result: dict[str, Any] = dict(memory(built.compiled))
  result["state"] = bytes_per_device(built.state)
  result["params"] = bytes_per_device(built.state["params"])
  result["optimizer"] = bytes_per_device(built.state["opt_state"])
  result["batch"] = bytes_per_device(built.batch)
  result["mesh"] = dict(built.mesh.shape)
  result["num_devices"] = built.mesh.size
  result["platform"] = built.mesh.devices.flat[0].platform
  result["lower_seconds"] = built.lower_seconds
  result["compile_seconds"] = built.compile_seconds
  result["bf16_as_float16"] = built.bf16_as_float16
  return result


def _device_memory_from_env() -> float | None:
  value = os.environ.get(DEVICE_MEMORY_ENV)
  return float(value) if value else None


def format_report(config, result: dict[str, Any],
                  device_memory_gib: float | None = None,
                  headroom: float = DEFAULT_HEADROOM) -> str:
  """The human-readable report of `analyse`'s result."""
  mesh = ", ".join(f"{k}={v}" for k, v in result["mesh"].items())
  acc = config.accumulation_steps
  data_parallel = math.prod(
      v for k, v in result["mesh"].items() if k in sharding_lib.DATA_AXES)
  per_device = config.batch_size // data_parallel
  m = config.model
  unit, scale = ("GiB", GIB) if result["total"] >= GIB / 4 else ("MiB", 2**20)
  gib = lambda key: result[key] / scale  # noqa: E731
  lines = [
      f"Train step compiled ahead of time for {result['num_devices']} "
      f"{result['platform']} devices, mesh {mesh}.",
      f"  model: H={m.hidden_size}, {m.num_hidden_layers} layers, FFN "
      f"{m.intermediate_size}, E={m.embedding_size}, vocab {m.vocab_size}; "
      f"compute {m.dtype}, params {m.param_dtype}; remat {m.remat}",
      f"  batch: {config.batch_size} global, {per_device} per data-parallel "
      f"shard, {acc} micro-batch{'es' if acc > 1 else ''} of "
      f"{per_device // acc}; seq {config.data.max_seq_length}, "
      f"{config.masking.max_predictions} predictions; optimizer "
      f"{config.optimizer.name}",
      f"Per device ({unit}):",
      f"  state (params + optimizer)  {gib('state'):9.3f}   params "
      f"{gib('params'):.3f}, optimizer {gib('optimizer'):.3f}  [exact]",
      f"  batch                       {gib('batch'):9.3f}   [exact]",
      f"  arguments (state + batch)   {gib('arguments'):9.3f}",
      f"  outputs (new state, metrics){gib('outputs'):9.3f}",
      f"  aliased (donated state)     {gib('aliased'):9.3f}",
      f"  temporaries                 {gib('temporaries'):9.3f}   "
      "activations, gradients, workspace [XLA:CPU estimate]",
      f"  total                       {gib('total'):9.3f}   arguments + "
      "outputs - aliased + temporaries",
  ]
  if device_memory_gib is not None:
    usable = budget(device_memory_gib, headroom)
    ok = fits(result["total"], device_memory_gib, headroom)
    lines.append(
        f"  fits {device_memory_gib:g} GiB/device with {headroom:.0%} "
        f"headroom ({usable / GIB:.1f} GiB usable): "
        f"{'yes' if ok else 'NO'} ({result['total'] / usable:.0%} of usable)")
  lines.append(f"Lowered in {result['lower_seconds']:.1f} s, compiled in "
               f"{result['compile_seconds']:.1f} s.")
  if result["bf16_as_float16"]:
    lines.append("  (bfloat16 compiled as float16 on CPU: the same sizes, "
                 "where XLA:CPU would widen bfloat16 buffers to float32.)")
  exact = {k: result[k] for k in (
      "state", "params", "optimizer", "batch", "arguments", "outputs",
      "aliased", "temporaries", "total")}
  lines.append(f"bytes per device: {json.dumps(exact)}")
  return "\n".join(lines)


def report(config, device_memory_gib: float | None = None,
           headroom: float = DEFAULT_HEADROOM, *, file=None
           ) -> dict[str, Any]:
  """Compiles the config's train step and prints the per-device report.

  Args:
    config: a full pre-training config.
    device_memory_gib: memory of one device, to say whether the step fits;
      None reads `ALBERT_JAX_DEVICE_MEMORY_GIB` (unset: no verdict).
    headroom: fraction of the device kept free (fragmentation, runtime).
    file: where to print (stdout).

  Returns:
    `analyse`'s dict (bytes per device), with "fits" (True/False/None).
  """
  if device_memory_gib is None:
    device_memory_gib = _device_memory_from_env()
  result = analyse(config)
  result["fits"] = fits(result["total"], device_memory_gib, headroom)
  result["device_memory_gib"] = device_memory_gib
  print(format_report(config, result, device_memory_gib, headroom),
        file=file or sys.stdout, flush=True)
  return result
