"""What a step does, read from its HLO text.

`compiled.as_text()` of a `jax.jit(...).lower(...).compile()` is the program
one device runs after SPMD partitioning and the backend's optimisations.
`analyse` counts two things in it:

  Mosaic kernels  custom calls to "tpu_custom_call": the Pallas TPU kernels
                  the step holds, by kernel name.
  collectives     all-gather, reduce-scatter, all-reduce, all-to-all and
                  collective-permute, with the bytes each one outputs on one
                  device (all-gather: the gathered array; reduce-scatter:
                  the scattered shard; all-reduce: the reduced buffer).

Counts are per step: an op inside a `while` body (the layer scan, the
accumulation scan) counts once per iteration. The trip count is the loop's
`known_trip_count` where the compiler records one, else read from its
condition (`counter < N`, the form a `lax.scan` lowers to); a loop whose
count cannot be read counts once, and `Stats.unknown_loops` says so.
The TPU compiler fuses a reduce-scatter into an all-reduce followed by a
slice, in a fusion whose computation it names "all-reduce-scatter"; such a
fusion counts as one reduce-scatter. Asynchronous forms (XLA's "-start" /
"-done" pairs, the TPU compiler's "AsyncCollectiveStart" / "Done" fusions)
count once, at their start, with the bytes of their result.

`matmul_flops` counts the FLOPs of the matmuls, Mosaic kernels and cuDNN
attention calls in the lowered (not yet optimised) HLO, where every matmul
is still a `dot`, with the same per-iteration counting; it checks
`model.flops`' analytic count.

`kernels` lists every kernel a compiled program launches with the HBM bytes
it reads and writes, its matmul FLOPs and what it is for (its category:
matmul, attention, LayerNorm, activation, other elementwise, copies and
stacking, optimizer); `tools.roofline` prices them on a card.
"""

from __future__ import annotations

import collections
import dataclasses
import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute")
MOSAIC_TARGET = "tpu_custom_call"
# The TPU compiler's name for a reduce-scatter lowered as all-reduce + slice.
_FUSED_REDUCE_SCATTER = "all-reduce-scatter"
# The TPU compiler's asynchronous collectives are two fusions, each holding
# a copy of the collective: "AsyncCollectiveStart" and "AsyncCollectiveDone".
_ASYNC_DONE = "AsyncCollectiveDone"

# Names carry a "%" in compiled HLO text and none in lowered HLO text.
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?(\S+) = (.*)$")
_CALLEE = re.compile(
    r"\b(calls|to_apply|body|condition|branch_computations)="
    r"(\{[^}]*\}|%?[\w.\-]+)")
_NAME = re.compile(r"%?([\w.\-]+)")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_TRANSFORMS = re.compile(r"^(?:(?:jvp|transpose|vmap|remat|checkpoint)_)+")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_COND_LIMIT = re.compile(
    r"ROOT %?\S+ = pred\[\]\S* compare\(%?\S+, %?(\S+)\), direction=LT")
_KERNEL_FLOPS = re.compile(r'"cost_estimate": ?\{[^}]*?"flops": ?"?(\d+)')
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")


@dataclasses.dataclass
class Stats:
  """Per-step counts of one compiled program (see the module docstring).

  Attributes:
    mosaic_kernels: kernel name → call sites executed per step.
    collectives: op → {"count": per step, "bytes": output bytes per step on
      one device}, for every op of `COLLECTIVES` (zeros where absent).
    unknown_loops: while loops whose trip count could not be read (their
      ops counted once).
  """
  mosaic_kernels: dict[str, int]
  collectives: dict[str, dict[str, int]]
  unknown_loops: int = 0

  @property
  def num_mosaic_kernels(self) -> int:
    return sum(self.mosaic_kernels.values())


def array_bytes(type_text: str) -> int:
  """Bytes of every array in an HLO type ("f32[8,128]{1,0}", tuples too).

  Sub-byte types (s4, u4) count as their packed size, rounded up.
  """
  total = 0
  for dtype, dims in _ARRAY.findall(type_text):
    if dtype == "pred":
      bits = 8
    else:
      match = re.search(r"(\d+)", dtype)
      if match is None:  # token[] and the like carry no data
        continue
      bits = int(match.group(1))
    count = 1
    for d in dims.split(","):
      if d:
        count *= int(d)
    total += -(-count * bits // 8)
  return total


def kernel_name(instruction: str) -> str:
  """A Pallas kernel's name from its custom call's instruction name, which
  carries the transformations it went through and a unique suffix
  ("transpose_jvp_albert_flash_bwd_dq__.3" → "albert_flash_bwd_dq")."""
  name = instruction.rsplit(".", 1)[0]
  return _TRANSFORMS.sub("", name).strip("_") or name


def _split_type(rest: str) -> tuple[str, str]:
  """(result type, text after it) of an instruction's right-hand side."""
  if not rest.startswith("("):
    head, _, tail = rest.partition(" ")
    return head, tail
  depth = 0
  for i, ch in enumerate(rest):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      return rest[:i + 1], rest[i + 1:].lstrip()
  return rest, ""


def _tuple_elements(type_text: str) -> list[str]:
  """Top-level elements of a tuple type ("(a, (b, c))" → ["a", "(b, c)"])."""
  inner, parts, depth, start = type_text[1:-1], [], 0, 0
  for i, ch in enumerate(inner):
    depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(ch, 0)
    if ch == "," and depth == 0:
      parts.append(inner[start:i].strip())
      start = i + 1
  parts.append(inner[start:].strip())
  return [p.split("*/")[-1].strip() for p in parts if p]


def _parse(hlo: str):
  """computation → its instructions as (name, type, opcode, text); the
  entry computation's name."""
  computations: dict[str, list[tuple[str, str, str, str]]] = {}
  current, entry = None, None
  for line in hlo.splitlines():
    match = _COMPUTATION.match(line)
    if match and not line.startswith(" "):
      current = match.group(1)
      computations[current] = []
      if line.startswith("ENTRY"):
        entry = current
      continue
    match = _INSTRUCTION.match(line)
    if match and current is not None:
      type_text, tail = _split_type(match.group(2))
      opcode = tail.partition("(")[0]
      computations[current].append((match.group(1), type_text, opcode,
                                    line))
    elif (current is not None and computations[current] and line.strip()
          and not line[0].isspace() and line != "}"):
      # Lowered HLO prints a backend config's JSON over several lines.
      *head, text = computations[current][-1]
      computations[current][-1] = (*head, text + line)
  return computations, entry


def _trip_count(line: str, computations) -> int | None:
  """Iterations of the while loop on `line`, or None if unreadable."""
  known = _TRIP.search(line)
  if known:
    return int(known.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", line)
  body = computations.get(cond.group(1), []) if cond else []
  constants = {name: text for name, _, op, text in body if op == "constant"}
  for _, _, op, text in body:
    limit = _COND_LIMIT.search(text) if op == "compare" else None
    if limit and limit.group(1) in constants:
      value = re.search(r"constant\((\d+)\)", constants[limit.group(1)])
      if value:
        return int(value.group(1))
  return None


def _callers_first(computations, entry) -> list[str]:
  """The computations reachable from `entry`, every caller before its
  callees (HLO call graphs are acyclic)."""
  callees = {c: {n for _, _, _, text in insts
                 for _, names in _CALLEE.findall(text)
                 for n in _NAME.findall(names)}
             for c, insts in computations.items()}
  reachable, stack = {entry}, [entry]
  while stack:
    for callee in callees.get(stack.pop(), ()):
      if callee not in reachable:
        reachable.add(callee)
        stack.append(callee)
  indegree = collections.Counter(
      n for c in reachable for n in callees.get(c, ()))
  ready, order = [entry], []
  while ready:
    name = ready.pop()
    order.append(name)
    for callee in callees.get(name, ()):
      indegree[callee] -= 1
      if indegree[callee] == 0:
        ready.append(callee)
  return order


def _run_counts(computations, entry) -> tuple[dict[str, int], int]:
  """Executions per step of each computation reachable from `entry`."""
  order = _callers_first(computations, entry)
  times = collections.Counter({entry: 1})
  unknown = 0
  for caller in order:
    for _, _, opcode, text in computations.get(caller, []):
      for kind, names in _CALLEE.findall(text):
        factor = 1
        if opcode == "while" and kind == "body":
          trips = _trip_count(text, computations)
          unknown += trips is None
          factor = trips or 1
        elif opcode == "while" and kind == "condition":
          # Checked once more than the body runs (the check that ends it).
          trips = _trip_count(text, computations)
          factor = trips + 1 if trips is not None else 1
        for callee in _NAME.findall(names):
          times[callee] += times[caller] * factor
  return times, unknown


def _dims(type_text: str) -> list[int]:
  """The dimensions of an array type ("f32[8,128]{1,0}" → [8, 128])."""
  match = _ARRAY.search(type_text)
  return [int(d) for d in match.group(2).split(",") if d] if match else []


def _dot_flops(text: str, result_type: str, types: dict[str, str]) -> int:
  """2 × output elements × contracted size of one `dot` instruction."""
  operand = text.split(" dot(", 1)[1].split(",", 1)[0].split(")")[0]
  lhs = _dims(types.get(operand.split()[-1].lstrip("%"), ""))
  contracting = _CONTRACTING.search(text)
  depth = 1
  for d in (contracting.group(1).split(",") if contracting else []):
    if d:
      depth *= lhs[int(d)]
  out = 1
  for d in _dims(result_type):
    out *= d
  return 2 * out * depth


def matmul_flops(hlo: str) -> dict[str, int]:
  """FLOPs of one run of the program's matmuls, every loop iteration
  counted: "dots" (2 × outputs × contracted size of each `dot`) and
  "kernels" (what each Mosaic kernel declares in its cost estimate).

  Meant for lowered HLO (`jax.stages.Lowered.as_text(dialect="hlo")`),
  whose matmuls are `dot`s of the global shapes; a backend's optimised
  HLO rewrites many of them as convolutions, which are not counted.
  """
  computations, entry = _parse(hlo)
  if entry is None:
    raise ValueError("No ENTRY computation in the HLO text.")
  times, _ = _run_counts(computations, entry)
  out = {"dots": 0, "kernels": 0}
  for name, insts in computations.items():
    runs = times.get(name, 0)
    types = {inst: type_text for inst, type_text, _, _ in insts}
    for _, type_text, opcode, text in insts:
      if not runs:
        break
      if opcode == "dot":
        out["dots"] += runs * _dot_flops(text, type_text, types)
      elif opcode == "custom-call" and f'"{MOSAIC_TARGET}"' in text:
        declared = _KERNEL_FLOPS.search(text)
        out["kernels"] += runs * int(declared.group(1)) if declared else 0
      elif opcode == "custom-call" and f'"{_CUDNN_ATTENTION}' in text:
        # cuDNN declares nothing: the convention, 2.5x the forward's
        # backward (what `kernels` prices it by).
        op_name = _OP_NAME.search(text)
        target = _TARGET.search(text).group(1)
        operand_types = [types.get(o, "") for o in _operands(text, opcode)]
        found = _attention(text, target, op_name.group(1) if op_name else "",
                           operand_types, type_text)
        if found:
          out["kernels"] += runs * (found.forward_flops * 5 // 2
                                    if found.direction == "bwd"
                                    else found.forward_flops)
  return out


def analyse(hlo: str) -> Stats:
  """Per-step Mosaic kernels and collectives of optimised HLO text."""
  computations, entry = _parse(hlo)
  if entry is None:
    raise ValueError("No ENTRY computation in the HLO text; pass "
                     "compiled.as_text() of a compiled step.")
  times, unknown = _run_counts(computations, entry)
  kernels: collections.Counter = collections.Counter()
  ops = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
  for name, insts in computations.items():
    runs = times.get(name, 0)
    if not runs or name.startswith(_FUSED_REDUCE_SCATTER) or any(
        f'"{_ASYNC_DONE}"' in text for *_, text in insts):
      continue  # counted at the reduce-scatter fusion / the async start
    for inst, type_text, opcode, text in insts:
      if opcode == "custom-call" and f'"{MOSAIC_TARGET}"' in text:
        kernels[kernel_name(inst)] += runs
        continue
      if opcode == "custom-call" and f'"{_MOSAIC_GPU}' in text:
        # A Mosaic GPU call is named by its mapping ("mpmd_map"), not its
        # kernel: say which pass it is.
        backward = "transpose(" in (_OP_NAME.search(text) or [""])[0]
        kernels[f"mosaic_gpu {'bwd' if backward else 'fwd'}"] += runs
        continue
      if opcode == "fusion" and re.search(
          f"calls=%?{_FUSED_REDUCE_SCATTER}", text):
        op, size = "reduce-scatter", array_bytes(type_text)
      elif opcode.endswith("-done"):
        continue
      elif opcode.removesuffix("-start") in COLLECTIVES:
        op = opcode.removesuffix("-start")
        size = array_bytes(type_text)
        if opcode.endswith("-start") and op != "all-reduce" and (
            type_text.startswith("(")):
          # (operands, results[, contexts]): the results are what it outputs.
          size = array_bytes(_tuple_elements(type_text)[1])
      else:
        continue
      ops[op]["count"] += runs
      ops[op]["bytes"] += runs * size
  return Stats(dict(sorted(kernels.items())), ops, unknown)


################################################################################
# Kernels and their memory traffic.
################################################################################

# Instructions that launch no kernel of their own: data movement by aliasing
# (bitcast, tuples), control flow (its bodies' kernels are counted), markers.
_FREE_OPS = frozenset((
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast",
    "while", "conditional", "call", "after-all", "add-dependency",
    "opt-barrier", "optimization-barrier", "partition-id", "replica-id",
    "domain", "get-dimension-size", "copy-done", "send-done", "recv-done",
    "all-gather-done", "all-reduce-done", "collective-permute-done",
    "async-done", "async-update"))
# Callee kinds whose computations launch kernels (a fusion's or a reducer's
# computation runs inside its caller's kernel).
_CONTROL_CALLEES = frozenset(("body", "condition", "branch_computations"))
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__triton_gemm")
_CUDNN_ATTENTION = "__cudnn$fmha"
_MOSAIC_GPU = "mosaic_gpu"
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_PARAM_INDEX = re.compile(r"parameter\((\d+)\)")
_INTERMEDIATE = re.compile(
    r'"intermediate_tensor_shape":\s*\{[^}]*?"dimensions":\s*\[([^\]]*)\]')
_MASK_TYPE = re.compile(r'"mask_type":\s*"(\w+)"')
_DOT_DIMS = re.compile(r'"lhs_contracting_dimensions":\s*\[([^\]]*)\]')
# Ops that only move, slice, fill or stack data.
_MOVE_OPS = frozenset((
    "copy", "dynamic-slice", "dynamic-update-slice", "slice", "broadcast",
    "concatenate", "pad", "transpose", "reshape", "iota", "constant",
    "parameter", "bitcast", "tuple", "get-tuple-element", "copy-start",
    "reverse"))

# Kernel categories, in the order a report lists them.
MATMUL = "matmul"
ATTENTION = "attention"
LAYER_NORM = "LayerNorm"
ACTIVATION = "activation (GELU)"
ELEMENTWISE = "other elementwise and reductions"
COPIES = "copies, slices, fills, stacking"
OPTIMIZER = "optimizer, guard, metrics"
COLLECTIVE = "collectives"
CATEGORIES = (MATMUL, ATTENTION, LAYER_NORM, ACTIVATION, ELEMENTWISE, COPIES,
              OPTIMIZER, COLLECTIVE)


@dataclasses.dataclass(frozen=True)
class Attention:
  """What an attention kernel computes, for pricing it.

  Attributes:
    impl: "cudnn" (cuDNN's fused attention), "pallas" (a Mosaic GPU or TPU
      kernel).
    direction: "fwd" or "bwd".
    seq: query length T.
    mask: "none" (every key), "padding" (sequence lengths), "bias" (a dense
      [B, 1, T, S] bias made from a mask), "segments" (segment ids), or
      "causal".
    forward_flops: 4·B·N·T·S·D of the forward pass whose part this kernel
      is (a backward kernel's share of 2.5x that is `flops`).
  """
  impl: str
  direction: str
  seq: int
  mask: str
  forward_flops: int


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One kernel launch site of a compiled program.

  Attributes:
    name: the HLO instruction.
    runs: executions per step (loop iterations multiplied in).
    opcode: "fusion", "custom-call", "copy", ...
    bytes: HBM bytes one execution reads and writes: its operands and
      results, except that an operand read only through a (dynamic) slice
      counts at the slice's size and an in-place dynamic-update-slice counts
      the update, not the buffer it updates.
    flops: matmul FLOPs of one execution (GEMMs; attention by the usual
      convention, 4·B·N·T·S·D forward and 2.5x that backward).
    category: one of `CATEGORIES`.
    op_name: the JAX name stack of its instruction ("" if none).
    attention: set for attention kernels.
  """
  name: str
  runs: int
  opcode: str
  bytes: int
  flops: int
  category: str
  op_name: str
  attention: Attention | None = None


def _operands(text: str, opcode: str) -> list[str]:
  """Operand names of an instruction line (the `%names` of its argument
  list)."""
  args = text.split(f" {opcode}(", 1)
  if len(args) < 2:
    return []
  depth, end = 1, len(args[1])
  for i, ch in enumerate(args[1]):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      end = i
      break
  names, depth, start, text = [], 0, 0, args[1][:end] + ","
  for i, ch in enumerate(text):
    depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
    if ch == "," and depth == 0:
      # "%name", "name" or "type %name", after any /*index=N*/ comment.
      token = text[start:i].split("*/")[-1].split()
      if token:
        names.append(token[-1].lstrip("%"))
      start = i + 1
  return names


def _callees(text: str, kinds) -> list[str]:
  return [n for kind, names in _CALLEE.findall(text) if kind in kinds
          for n in _NAME.findall(names)]


def _control_computations(computations, entry) -> set[str]:
  """The computations whose instructions launch kernels: the entry and,
  recursively, loop bodies and conditions, conditional branches and called
  computations."""
  found, stack = {entry}, [entry]
  while stack:
    for _, _, opcode, text in computations.get(stack.pop(), []):
      kinds = set(_CONTROL_CALLEES) | ({"to_apply", "calls"}
                                       if opcode == "call" else set())
      for callee in _callees(text, kinds):
        if callee not in found:
          found.add(callee)
          stack.append(callee)
  return found


def _read_bytes(computations, body, param_index: int, size: int) -> int:
  """What a fused computation reads of its parameter `param_index` (of
  `size` bytes): all of it, or only the (dynamic) slices taken of it,
  through bitcasts and nested fusions (the TPU compiler nests them); none
  of a buffer it updates in place."""
  types = {name: t for name, t, _, _ in body}
  users = collections.defaultdict(list)
  param = None
  for name, _, opcode, text in body:
    if opcode == "parameter" and int(_PARAM_INDEX.search(text).group(1)) == (
        param_index):
      param = name
    for i, operand in enumerate(_operands(text, opcode)):
      users[operand].append((name, opcode, i, text))

  def read(name: str) -> int:
    total = 0
    for user, opcode, index, text in users.get(name, []):
      if opcode == "bitcast":
        total += read(user)
      elif opcode in ("dynamic-slice", "slice") and index == 0:
        total += array_bytes(types[user])
      elif opcode == "dynamic-update-slice" and index == 0:
        continue  # updated in place: the buffer is not read
      elif opcode == "fusion" and _callees(text, ("calls",)):
        nested = computations.get(_callees(text, ("calls",))[0], [])
        total += _read_bytes(computations, nested, index, size)
      else:
        return size
    return total

  return size if param is None else min(read(param), size)


def _fusion_traffic(computations, body, result_type: str,
                    operand_types: list[str]) -> int:
  """HBM bytes of one run of a fusion whose computation is `body`: what
  it reads of each operand (`_read_bytes`) and what it writes (an in-place
  update's update, else its results)."""
  types = {name: t for name, t, _, _ in body}
  root = next(((n, op, t) for n, _, op, t in body
               if t.lstrip().startswith("ROOT")), None)
  roots = [root] if root and root[1] != "tuple" else [
      (n, op, t) for n, _, op, t in body
      if root and n in _operands(root[2], "tuple")]
  written = 0
  for name, opcode, text in roots:
    if opcode == "dynamic-update-slice":
      update = _operands(text, opcode)[1]
      written += array_bytes(types[update])
    else:
      written += array_bytes(types.get(name, ""))
  if not roots:
    written = array_bytes(result_type)
  return written + sum(
      _read_bytes(computations, body, index, array_bytes(type_text))
      for index, type_text in enumerate(operand_types))


def _dot_flops_in(body) -> int:
  """Matmul FLOPs of the dots and convolutions in a fused computation."""
  types = {name: t for name, t, _, _ in body}
  return sum(_dot_flops(text, t, types) for _, t, op, text in body
             if op == "dot")


def _gemm_call_flops(text: str, result_type: str,
                     operand_types: list[str]) -> int:
  """FLOPs of a cuBLAS GEMM custom call: 2 × outputs × contracted size."""
  lhs = _dims(operand_types[0]) if operand_types else []
  dims = _DOT_DIMS.search(text)
  depth = 1
  for d in (dims.group(1).replace('"', "").split(",") if dims else []):
    if d.strip():
      depth *= lhs[int(d)]
  out = result_type if not result_type.startswith("(") else (
      _tuple_elements(result_type)[0])
  count = 1
  for d in _dims(out):
    count *= d
  return 2 * count * depth


def _attention(text: str, target: str, op_name: str,
               operand_types: list[str], result_type: str
               ) -> Attention | None:
  """The `Attention` of a cuDNN or Mosaic attention custom call."""
  backward = "Backward" in target or "transpose(" in op_name
  if target.startswith(_CUDNN_ATTENTION):
    shape = _INTERMEDIATE.search(text)
    if not shape:
      return None
    b, n, t, s = (int(d.strip().strip('"')) for d in shape.group(1).split(","))
    head_dim = _dims(operand_types[0])[-1]
    mask = (_MASK_TYPE.search(text).group(1) if _MASK_TYPE.search(text)
            else "NO_MASK")
    kind = {"NO_MASK": "none", "PADDING": "padding", "CAUSAL": "causal",
            "PADDING_CAUSAL": "causal"}.get(mask, mask.lower())
    if "Bias" in target and kind == "none":
      kind = "bias"
    return Attention("cudnn", "bwd" if backward else "fwd", t, kind,
                     4 * b * n * t * s * head_dim)
  if target.startswith(_MOSAIC_GPU) or target == MOSAIC_TARGET:
    if "Attention" not in op_name and "attention" not in op_name:
      return None
    # The flash kernels take q, k, v as [B, T, N, D], then segment ids.
    b, t, n, d = (_dims(operand_types[0]) + [1, 1, 1, 1])[:4]
    has_ids = any(x.startswith("s32[") and len(_dims(x)) == 2
                  for x in operand_types)
    return Attention("pallas", "bwd" if backward else "fwd", t,
                     "segments" if has_ids else "none", 4 * b * n * t * t * d)
  return None


def _category(opcode: str, op_name: str, result_type: str, body,
              training: bool) -> str:
  """Which of `CATEGORIES` a kernel that is neither a GEMM nor attention
  falls in, from the ops it runs on arrays (scalar index arithmetic left
  out) and their JAX name stacks: only moves → copies; in a `training`
  program, outside the forward and backward passes (no "jvp(" in any name
  stack) → optimizer; else LayerNorm or activation when any of its ops is
  one (a fusion of the activation's backward with a bias gradient is the
  activation's), else elementwise."""
  if opcode.removesuffix("-start") in COLLECTIVES:
    return COLLECTIVE
  work = [(op, text) for _, t, op, text in body
          if _dims(t) and op not in ("parameter", "constant")] if body else [
              (opcode, f'op_name="{op_name}"' if op_name else "")]
  if not body and not _dims(result_type):
    work = []
  if all(op in _MOVE_OPS for op, _ in work):
    return COPIES
  names = [m.group(1) for _, text in work for m in [_OP_NAME.search(text)]
           if m]
  if training and names and not any("jvp(" in n for n in names):
    return OPTIMIZER
  if any("layer_norm" in n for n in names):
    return LAYER_NORM
  if any("/activation/" in n for n in names):
    return ACTIVATION
  return ELEMENTWISE


def kernels(hlo: str) -> list[Kernel]:
  """Every kernel launch site of optimised HLO text, with its bytes, FLOPs,
  category and executions per step (see `Kernel`).

  A kernel is a top-level instruction of the entry computation or of a
  loop's body or condition that is not free (`_FREE_OPS`): a fusion, a
  custom call, a copy, an unfused op. Meant for GPU programs, where each is
  a launch; on TPU the same accounting gives the program's HBM traffic
  (its matmuls are convolutions, in the matmul category with their FLOPs
  not counted: the TPU compiler writes batched matmuls as padded windowed
  convolutions whose FLOPs are not those of the matmul they compute).
  """
  computations, entry = _parse(hlo)
  if entry is None:
    raise ValueError("No ENTRY computation in the HLO text; pass "
                     "compiled.as_text() of a compiled step.")
  times, _ = _run_counts(computations, entry)
  training = "jvp(" in hlo  # a train step: autodiff's passes are named
  found = []
  for computation in sorted(_control_computations(computations, entry)):
    runs = times.get(computation, 0)
    insts = computations.get(computation, [])
    types = {name: t for name, t, _, _ in insts}
    for name, result_type, opcode, text in insts:
      if not runs or opcode in _FREE_OPS or opcode.endswith("-done"):
        continue
      operand_types = [types.get(o, "") for o in _operands(text, opcode)]
      op_name = _OP_NAME.search(text)
      op_name = op_name.group(1) if op_name else ""
      target = _TARGET.search(text)
      target = target.group(1) if target else ""
      body = []
      if opcode == "fusion":
        called = _callees(text, ("calls",))
        body = computations.get(called[0], []) if called else []
        size = _fusion_traffic(computations, body, result_type,
                                operand_types)
      else:
        size = array_bytes(result_type) + sum(
            array_bytes(t) for t in operand_types)
        if opcode == "dynamic-update-slice":
          size = 2 * array_bytes(operand_types[1])
        elif opcode in ("dynamic-slice", "slice"):
          size = 2 * array_bytes(result_type)
      flops, attention, category = 0, None, None
      convolutions = [t for _, _, op, t in body or [(0, 0, opcode, text)]
                       if op == "convolution"]
      if opcode == "fusion" and any(op == "dot" for _, _, op, _ in body):
        flops, category = _dot_flops_in(body), MATMUL
      elif convolutions:
        category = MATMUL
      elif opcode == "dot":
        flops, category = _dot_flops(text, result_type, types), MATMUL
      elif opcode == "custom-call" and target in _GEMM_TARGETS:
        flops = _gemm_call_flops(text, result_type, operand_types)
        category = MATMUL
      elif opcode == "custom-call":
        attention = _attention(text, target, op_name, operand_types,
                               result_type)
        if attention:
          category = ATTENTION
          flops = attention.forward_flops
          if attention.direction == "bwd":
            flops = flops * 5 // 2
            if attention.impl == "pallas":
              # Two kernels share the backward: dq (3 of its 7 matmuls,
              # one output) and dk/dv (4 of 7, two outputs).
              outputs = (len(_tuple_elements(result_type))
                         if result_type.startswith("(") else 1)
              flops = flops * (4 if outputs > 1 else 3) // 7
      if category is None:
        category = _category(opcode, op_name, result_type, body, training)
      found.append(Kernel(name, runs, opcode, size, flops, category, op_name,
                          attention))
  return found
