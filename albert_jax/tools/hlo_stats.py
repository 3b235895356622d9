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

`matmul_flops` counts the FLOPs of the matmuls and Mosaic kernels in the
lowered (not yet optimised) HLO, where every matmul is still a `dot`, with
the same per-iteration counting; it checks `model.flops`' analytic count.
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
