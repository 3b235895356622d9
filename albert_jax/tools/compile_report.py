"""The report `--compile_only` prints, and its fits / does-not-fit verdict.

`format_report` turns `compile_only.analyse`'s per-device figures into text:
the memory (labelled as the TPU compiler's, or as XLA:CPU's estimate), the
verdict against a device's memory less headroom, the FLOPs (analytic, as
counted in the step's HLO, and the compiler's cost analysis), the Mosaic
kernels and the collectives per step, and one machine-readable line of
exact bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from albert_jax import sharding as sharding_lib
from albert_jax.tools import roofline

GIB = 1024 ** 3
DEFAULT_HEADROOM = 0.10
# Where a compile's memory figures come from, as the report labels them.
TPU_COMPILER = "TPU compiler"
GPU_COMPILER = "XLA:GPU compiler"
CPU_ESTIMATE = "XLA:CPU estimate"
MEMORY_SOURCES = {"tpu": TPU_COMPILER, "gpu": GPU_COMPILER}


@dataclasses.dataclass(frozen=True)
class StepShape:
  """The run's step as the report's batch line words it.

  Attributes:
    batch_size: rows per step, all hosts together (`config.batch_size`).
    accumulation_steps: micro-batches a step (`config.accumulation_steps`).
    max_seq_length: tokens a row (`config.data.max_seq_length`).
    optimizer: `config.optimizer.name`.
  """
  batch_size: int
  accumulation_steps: int
  max_seq_length: int
  optimizer: str

  @classmethod
  def from_config(cls, config) -> StepShape:
    """The step of a pre-training or fine-tuning config.

    Reads: batch_size, accumulation_steps, data.max_seq_length,
    optimizer.name.
    """
    return cls(batch_size=config.batch_size,
               accumulation_steps=config.accumulation_steps,
               max_seq_length=config.data.max_seq_length,
               optimizer=config.optimizer.name)


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


def _size(n: float) -> str:
  """Bytes as B / KiB / MiB / GiB."""
  for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:.2f} {unit}"
  return f"{n:.0f} B"


def _program_lines(result: dict[str, Any]) -> list[str]:
  """The report's lines on FLOPs, Mosaic kernels and collectives."""
  analytic, attention = result["flops_analytic"], result[
      "flops_analytic_attention"]
  matmuls, kernels = result["flops_hlo_matmuls"], result["flops_hlo_kernels"]
  lines = [
      f"FLOPs per device per step, analytic (model.flops: matmuls, 3 × "
      f"forward): {analytic:.4g}",
      f"  counted in the step's HLO, every loop iteration: "
      f"{matmuls + kernels:.4g} ({(matmuls + kernels) / analytic:.3f}x)"]
  if kernels:
    lines.append(
        f"    matmuls {matmuls:.4g} ({matmuls / (analytic - attention):.3f}x "
        f"analytic without attention), attention kernels {kernels:.4g} "
        f"({kernels / attention:.3f}x analytic attention)")
  lines.append(
      "    (the HLO also counts recomputation, which model.flops leaves out "
      "as MFU should: remat's forward matmuls; the flash backward's second "
      "pass over the attention scores, 1.5x; cuDNN attention declares no "
      "FLOPs and is counted by the convention, backward 2.5 forwards, "
      "1.167x)")
  if result["flops_compiler"] is not None:
    lines.append(f"  compiler's cost_analysis(): {result['flops_compiler']:.4g} "
                 "(elementwise work included, each loop body counted once: "
                 "not a per-step count)")
  if result["hlo_error"]:
    lines.append("Mosaic kernels and collectives: unknown, the compiled "
                 f"program's HLO text is unreadable ({result['hlo_error']})")
    return lines
  calls = result["mosaic_kernels"] or {}
  if result["platform"] == "tpu" or calls:
    names = ", ".join(f"{k} {v}" for k, v in calls.items())
    lines.append(f"Mosaic kernels per step: {sum(calls.values())}"
                 + (f" ({names})" if names else " (attention runs on XLA)"))
  ops = ", ".join(f"{op} {c['count']} ({_size(c['bytes'])})"
                  for op, c in result["collectives"].items())
  lines.append(f"Collectives per step (count, output bytes per device): "
               f"{ops}.")
  if result["unknown_loops"]:
    lines.append(f"  ({result['unknown_loops']} loop(s) of unknown trip "
                 "count: their collectives and kernels counted once.)")
  return lines


def _packed_rows(result: dict[str, Any]) -> str:
  """For a packed run, what the batch line's rows mean: the run takes the
  rows that hold batch_size examples (a fine-tune) or instances
  (pre-training), fewer than batch_size."""
  pack = result.get("examples_per_row", 0)
  if not pack:
    return ""
  items = ("examples" if str(result.get("target", "")).startswith("finetune")
           else "instances")
  return (f"; packed, up to {pack} {items} a row: a run takes the rows that "
          f"hold batch_size {items} (fewer), so this compile of batch_size "
          "rows is an upper bound")


def format_report(step: StepShape, result: dict[str, Any],
                  device_memory_gib: float | None = None,
                  headroom: float = DEFAULT_HEADROOM) -> str:
  """The human-readable report of `analyse`'s result for the config whose
  step is `step` (`StepShape.from_config`)."""
  mesh = ", ".join(f"{k}={v}" for k, v in result["mesh"].items())
  acc = step.accumulation_steps
  data_parallel = math.prod(
      v for k, v in result["mesh"].items() if k in sharding_lib.DATA_AXES)
  per_device = step.batch_size // data_parallel
  tpu = result["memory_source"] == TPU_COMPILER
  source = result["memory_source"]
  accelerator = source != CPU_ESTIMATE
  unit_name = {TPU_COMPILER: "chip", GPU_COMPILER: "GPU"}.get(source,
                                                               "device")
  m = result["model"]
  unit, scale = ("GiB", GIB) if result["total"] >= GIB / 4 else ("MiB", 2**20)
  gib = lambda key: result[key] / scale  # noqa: E731
  plural = "s" if result["num_devices"] > 1 else ""
  where = (f"by the {source} for {result['num_devices']} "
           f"{result['device_kind']} {unit_name}{plural} (topology "
           f"{result['topology']})" if accelerator else
           f"for {result['num_devices']} {result['platform']} devices")
  lines = [
      f"Train step ({result['target']}) compiled ahead of time {where}, "
      f"mesh {mesh}.",
      f"  model: H={m['hidden_size']}, {m['num_hidden_layers']} layers, FFN "
      f"{m['intermediate_size']}, E={m['embedding_size']}, vocab "
      f"{m['vocab_size']}; compute {m['dtype']}, params {m['param_dtype']}; "
      f"remat {m['remat']}; attention {m['attention_impl']}",
      f"  batch: {step.batch_size} global, {per_device} per data-parallel "
      f"shard, {acc} micro-batch{'es' if acc > 1 else ''} of "
      f"{per_device // acc}; seq {step.max_seq_length}; optimizer "
      f"{step.optimizer}" + _packed_rows(result),
      f"Per {unit_name} ({unit}), "
      f"{('the ' + source) if accelerator else 'XLA:CPU'}'s memory "
      "analysis:",
      f"  state (params + optimizer)  {gib('state'):9.3f}   params "
      f"{gib('params'):.3f}, optimizer {gib('optimizer'):.3f}  [exact]",
      f"  batch                       {gib('batch'):9.3f}   [exact]",
      f"  arguments (state + batch)   {gib('arguments'):9.3f}"
      + ("   as laid out (TPU tiles pad small arrays)" if tpu else ""),
      f"  outputs (new state, metrics){gib('outputs'):9.3f}",
      f"  aliased (donated state)     {gib('aliased'):9.3f}",
      f"  temporaries                 {gib('temporaries'):9.3f}   "
      f"activations, gradients, workspace [{source}]",
      f"  total per {unit_name:6s}            "
      f"{gib('total'):9.3f}   arguments + outputs - aliased + temporaries "
      f"[{source}]",
  ]
  if device_memory_gib is not None:
    usable = budget(device_memory_gib, headroom)
    ok = fits(result["total"], device_memory_gib, headroom)
    lines.append(
        f"  fits {device_memory_gib:.3g} GiB/{unit_name} "
        f"with {headroom:.0%} headroom ({usable / GIB:.1f} GiB usable): "
        f"{'yes' if ok else 'NO'} ({result['total'] / usable:.0%} of usable)")
  lines += _program_lines(result)
  if result.get("traffic") is not None:
    lines += roofline.format_summary(
        result["traffic"], f"{result['device_kind']}, per {unit_name}")
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
