"""Ahead-of-time compile of the train step: will this config fit?

  python -m albert_jax.main --config=configs/albert_base.py --compile_only \
      --topology=v5e:16x16 --config.model.dtype=bfloat16
  python -m albert_jax.main --config=configs/albert_xxlarge.py \
      --compile_only --num_fake_devices=64 --config.model.remat=full

Builds the abstract train state and batch for the config's mesh, lowers and
compiles the sharded train step without allocating anything, and prints
`compiled.memory_analysis()` per device: the parameter + optimizer state the
step takes in, its outputs, and the temporaries it needs, and whether their
sum fits a device of a given size (`report(config, device_memory_gib=32)`,
the environment variable `ALBERT_JAX_DEVICE_MEMORY_GIB`, or for a TPU
topology the chip's HBM; `compile_report` words the report). The step is
the one the config runs: its pre-training objective (masked_lm, electra,
causal_lm), or with `config.job="finetune"` the task's fine-tuning step
(`compile_targets`). Other meshes: `--config.mesh="(('data', 1), ('fsdp',
-1))"` (ml-collections parses a tuple field from the command line, not a
list); `parse_mesh` also reads the string form "data:1,fsdp:-1".

With `--topology=NAME` (`albert_jax.tools.topology`; needs libtpu) the mesh
is made of the abstract chips of that TPU slice and the step is compiled by
the real TPU compiler, Mosaic kernels included: the memory figures are the
TPU compiler's own, and a step that needs more HBM than a chip has is
refused by the compiler itself (`DoesNotFit`, with the bytes it asked for).
With `--topology=h100` (or h100:8, h200; `albert_jax.tools.topology`, the
`gpu_aot` extra) the mesh is made of compile-only GPUs and XLA:GPU compiles
the step as it would for the card (its memory analysis predicted an H100's
measured temporaries within 2%); the report then lists every kernel's HBM
bytes by category and prices them on the card (`tools.roofline`: a step
time and MFU, with the calibration against measured steps stated). A TPU
slice gets the same kernel table, priced at datasheet rates.
The report adds what the step does (`hlo_stats`): its Mosaic kernels and
collectives per step, and three FLOP counts per device. `model.flops`'
analytic count is the model's matmuls, 3 × forward (what MFU is measured
against). The matmuls counted in the step's lowered HLO, every loop
iteration, with the Mosaic kernels' declared costs, check it: for ALBERT
they match it to the FLOP except where the step recomputes (remat's forward
matmuls; the flash kernels' backward recomputes the attention scores, 1.5x
that part), which MFU rightly leaves out. The compiler's own
`cost_analysis()` adds elementwise work but counts each loop body once (the
layer scan as one layer), so it is shown but is not a per-step figure; its
"optimal_seconds" is not a time for a whole step (it can be negative) and
is not shown.

With fake CPU devices (`--num_fake_devices=N`) the numbers are those of
XLA:CPU's buffer assignment for the same sharded (SPMD-partitioned)
program, an estimate. The state and batch sizes per device are exact; the
temporaries can be far from the TPU compiler's, either way round
(ALBERT-base without remat on v5e-256, FSDP: 10.3 GiB per device by
XLA:CPU, 2.95 GiB by the TPU compiler; experiments/memory_table.md has both
for every setting), so read a CPU estimate as a rough guide, not a verdict.

Two things differ from a plain `.compile()` on CPU, both because only the
buffer assignment is wanted: the LLVM back end runs at its cheapest
settings (`run_setup.FAST_COMPILE_OPTIONS`: ~6x faster, same buffers), and a
bfloat16 model is compiled as float16 (`compile_targets.BF16_STAND_IN`:
same sizes; XLA:CPU would widen bfloat16 buffers to float32).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from albert_jax import sharding as sharding_lib
from albert_jax.tools import compile_report
from albert_jax.tools import compile_targets
from albert_jax.tools import hlo_stats
from albert_jax.tools import roofline
from albert_jax.tools import topology as topology_lib
from albert_jax.training import optimizer as optim
from albert_jax.training import run_setup
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

DEVICE_MEMORY_ENV = "ALBERT_JAX_DEVICE_MEMORY_GIB"


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


class DoesNotFit(ValueError):
  """The TPU compiler refused the step: it needs more HBM than a chip has.

  Attributes:
    required_bytes, available_bytes: the compiler's figures (None where its
      message gives none).
  """

  def __init__(self, message: str, required_bytes: float | None = None,
               available_bytes: float | None = None):
    super().__init__(message)
    self.required_bytes = required_bytes
    self.available_bytes = available_bytes


_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_OOM = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM "
                  r"\(([\d.]+)([KMGT])\)")


def _does_not_fit(error: Exception) -> DoesNotFit:
  """A compiler's out-of-memory error as `DoesNotFit`."""
  line = next((l for l in str(error).splitlines() if "HBM" in l),
              str(error).splitlines()[0])
  match = _OOM.search(line)
  sizes = (float(match.group(1)) * _UNITS[match.group(2)],
           float(match.group(3)) * _UNITS[match.group(4)]) if match else (
               None, None)
  return DoesNotFit(
      f"The train step does not fit: {line.strip()} Use less memory per "
      "chip: model.remat=full (or dots_no_batch), more "
      "accumulation_steps, an FSDP mesh, or more chips.", *sizes)


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
  target: compile_targets.Target
  lowered: Any  # the jax.stages.Lowered step


def compile_train_step(config, *, fast: bool = True,
                       stand_in_16bit: bool = True,
                       topology: str | None = None) -> Compiled:
  """Lowers and compiles the config's sharded train step; allocates nothing.

  Args:
    config: a full pre-training or fine-tuning config.
    fast: compile with `run_setup.FAST_COMPILE_OPTIONS` on CPU (same buffers, cheaper
      code generation).
    stand_in_16bit: on CPU, compile bfloat16 as float16 (see
      `compile_targets.BF16_STAND_IN`).
    topology: a TPU slice ("v5e:16x16", `albert_jax.tools.topology`) to
      compile for with the TPU compiler, instead of this host's devices.
  """
  devices = topology_lib.devices(topology) if topology else None
  mesh, rules = sharding_lib.mesh_and_rules(
      parse_mesh(config.mesh), config.sharding_rules, devices)
  data_parallel = sharding_lib.data_parallel_size(mesh)
  b, acc = config.batch_size, config.accumulation_steps
  if b % (data_parallel * acc):
    raise ValueError(
        f"batch_size {b} must be divisible by the data-parallel size "
        f"({data_parallel}) × accumulation_steps ({acc}).")
  platform = mesh.devices.flat[0].platform
  target = compile_targets.for_config(config, platform, stand_in_16bit)
  tx, schedule = optim.make(config.optimizer, config.num_train_steps,
                            target.model_config)
  start = time.perf_counter()
  init = state_lib.state_init_fn(target.init_params, tx)
  # Tracing cuDNN attention (init traces the model too) asks for cuDNN's
  # version, which a host without the CUDA libraries answers from the
  # target config.
  gpu = topology and topology_lib.is_gpu(topology)
  lowering = lambda: (  # noqa: E731  (a fresh context each time)
      topology_lib.gpu_lowering(topology_lib.gpu_topology(topology)[0])
      if gpu else contextlib.nullcontext())
  with lowering():
    abstract, shardings = state_lib.abstract_state(init, tx, mesh, rules,
                                                   jax.random.key(0))
  state = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract, shardings)
  batch = abstract_batch(target.batch_schema,
                         sharding_lib.data_sharding(mesh))
  step = step_lib.make_train_step(target.objective, tx, schedule, acc)
  train = step_lib.jit_train_step(step, shardings, mesh, rules)
  with lowering():
    lowered = train.lower(state, batch)
  lower_seconds = time.perf_counter() - start
  options = None
  if fast and platform == "cpu":
    # They change how fast XLA:CPU emits machine code, not which buffers it
    # assigns (ALBERT-xxlarge's train step on 64 devices: 8 s instead of
    # 50 s, the same bytes; configs/tiny.py's moves by < 0.1%).
    options = dict(run_setup.FAST_COMPILE_OPTIONS)
  start = time.perf_counter()
  try:
    compiled = lowered.compile(compiler_options=options)
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" in str(e):
      raise _does_not_fit(e) from e
    raise
  return Compiled(compiled, mesh, state, batch, lower_seconds,
                  time.perf_counter() - start, target.bf16_as_float16,
                  target, lowered)


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


def compiler_flops(compiled) -> float | None:
  """FLOPs per device of one run of `compiled`, by its own cost analysis."""
  costs = compiled.cost_analysis()
  if isinstance(costs, (list, tuple)):  # older jax: one dict per program
    costs = costs[0] if costs else {}
  flops = (costs or {}).get("flops")
  return None if flops is None else float(flops)


def analyse(config, *, fast: bool = True,
            topology: str | None = None) -> dict[str, Any]:
  """Compiles the config's train step; per-device bytes and context.

  Besides `memory`'s bytes: the exact state and batch bytes, the mesh, where
  the figures come from ("memory_source"), FLOPs per device (the
  compiler's and `model.flops`' analytic count) and `hlo_stats`' Mosaic
  kernels and collectives per step.
  """
  built = compile_train_step(config, fast=fast, topology=topology)
  result: dict[str, Any] = dict(memory(built.compiled))
  result["state"] = bytes_per_device(built.state)
  result["params"] = bytes_per_device(built.state["params"])
  result["optimizer"] = bytes_per_device(built.state["opt_state"])
  result["batch"] = bytes_per_device(built.batch)
  result["mesh"] = dict(built.mesh.shape)
  result["num_devices"] = built.mesh.size
  device = built.mesh.devices.flat[0]
  result["platform"] = device.platform
  result["device_kind"] = device.device_kind
  result["topology"] = topology
  result["memory_source"] = compile_report.MEMORY_SOURCES.get(
      device.platform, compile_report.CPU_ESTIMATE)
  result["target"] = built.target.name
  result["examples_per_row"] = built.target.examples_per_row
  result["model"] = built.target.model_config.to_dict()
  result["flops_analytic"] = built.target.flops_per_step / built.mesh.size
  result["flops_analytic_attention"] = (
      built.target.attention_flops_per_step / built.mesh.size)
  # The lowered program's dots have global shapes; its kernels, run per
  # shard, their own.
  lowered_hlo = built.lowered.as_text(dialect="hlo")
  counted = hlo_stats.matmul_flops(lowered_hlo)
  result["flops_hlo_matmuls"] = counted["dots"] / built.mesh.size
  result["flops_hlo_kernels"] = counted["kernels"]
  result["flops_compiler"] = compiler_flops(built.compiled)
  result["hlo_error"] = None
  result["traffic"] = None
  try:
    hlo = built.compiled.as_text()
    stats = hlo_stats.analyse(hlo)
  except jax.errors.JaxRuntimeError as e:
    # jaxlib cannot print every program libtpu compiles (v5p:4x4x4's
    # async collectives: "async-update instruction should have 1
    # operands"); the memory analysis stands without it.
    stats = None
    result["hlo_error"] = str(e).splitlines()[0]
  if stats is not None and device.platform != "cpu":
    # What each kernel moves and computes, priced on the card or chip.
    result["traffic"] = roofline.summarize(
        hlo_stats.kernels(hlo), roofline.card(device.device_kind),
        result["flops_analytic"])
  result["mosaic_kernels"] = stats and stats.mosaic_kernels
  result["collectives"] = stats and stats.collectives
  result["unknown_loops"] = stats.unknown_loops if stats else 0
  result["lower_seconds"] = built.lower_seconds
  result["compile_seconds"] = built.compile_seconds
  result["bf16_as_float16"] = built.bf16_as_float16
  return result


def _device_memory_from_env() -> float | None:
  value = os.environ.get(DEVICE_MEMORY_ENV)
  return float(value) if value else None


def report(config, device_memory_gib: float | None = None,
           headroom: float = compile_report.DEFAULT_HEADROOM, *,
           topology: str | None = None,
           file=None) -> dict[str, Any]:
  """Compiles the config's train step and prints the per-device report.

  Args:
    config: a full pre-training or fine-tuning config.
    device_memory_gib: memory of one device, to say whether the step fits;
      None reads `ALBERT_JAX_DEVICE_MEMORY_GIB`, and failing that takes a
      TPU chip's HBM (`topology.HBM_GIB`; on CPU: no verdict).
    headroom: fraction of the device kept free (fragmentation, runtime).
    topology: a TPU slice to compile for with the TPU compiler
      (`albert_jax.tools.topology`), instead of this host's devices.
    file: where to print (stdout).

  Returns:
    `analyse`'s dict (bytes per device), with "fits" (True/False/None).
  """
  if device_memory_gib is None:
    device_memory_gib = _device_memory_from_env()
  result = analyse(config, topology=topology)
  if device_memory_gib is None and result["platform"] != "cpu":
    device_memory_gib = topology_lib.hbm_gib(result["device_kind"])
  result["fits"] = compile_report.fits(result["total"], device_memory_gib,
                                       headroom)
  result["device_memory_gib"] = device_memory_gib
  print(compile_report.format_report(
      compile_report.StepShape.from_config(config), result,
      device_memory_gib, headroom),
        file=file or sys.stdout, flush=True)
  return result
