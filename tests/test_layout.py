"""The package's shape: stages as folders in data-flow order, each importing
only the stages before it; no import cycles, no shims; below the drivers,
stages take their section of a run's config, not the whole of it.

Read statically (ast), so function-level imports count too: a cycle hidden
behind a lazy import is still a cycle.
"""

import ast

from locations import REPO

PACKAGE = REPO / "albert_jax"


def _modules() -> dict[str, ast.Module]:
  """Dotted module name → its parsed source, for every module of the package."""
  out = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"))
  return out


def _edges(name: str, tree: ast.Module, modules) -> set[str]:
  """The package modules that `name` imports, anywhere in its source."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (
        node.module or "").startswith("albert_jax"):
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        out.add(full if full in modules else node.module)
    elif isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name.startswith("albert_jax"))
  out.discard(name)
  return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle in `graph`, as a path that returns to its start."""
  state = {}  # module → "open" while on the path, "done" after

  def visit(node, path):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt, path + [nxt])
        if found:
          return found
    state[node] = "done"
    return None

  for start in sorted(graph):
    if start not in state:
      found = visit(start, [start])
      if found:
        return found
  return None


def _defined(tree: ast.Module) -> set[str]:
  """Names a module defines itself (not ones it imports) at top level."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for t in targets:
        for n in ast.walk(t):
          if isinstance(n, ast.Name):
            names.add(n.id)
  return names


def test_no_import_cycles():
  modules = _modules()
  graph = {m: _edges(m, t, modules) for m, t in modules.items()}
  assert _cycle(graph) is None, " → ".join(_cycle(graph))


def test_cycle_finder_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [
      "a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_at_most_ten_top_level_modules():
  top = sorted(p.name for p in PACKAGE.glob("*.py"))
  assert len(top) <= 10, top


def test_stages_are_folders():
  folders = {p.name for p in PACKAGE.iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
  assert {"text", "data", "model", "training", "finetune", "interop", "ops",
          "tools"} <= folders


def test_no_name_is_imported_through_a_shim():
  """Every `from albert_jax.X import Y` names a module, or something X
  defines itself; the top-level package's lazy public API is the one
  exception (that is the API users import from)."""
  modules = _modules()
  users = dict(modules)
  for path in sorted((REPO / "tests").rglob("*.py")) + sorted(
      (REPO / "experiments").rglob("*.py")):
    users[str(path.relative_to(REPO))] = ast.parse(
        path.read_text(encoding="utf-8"))
  shims = []
  for user, tree in users.items():
    for node in ast.walk(tree):
      if not (isinstance(node, ast.ImportFrom) and node.level == 0 and
              (node.module or "").startswith("albert_jax.")):
        continue
      target = modules.get(node.module)
      if target is None:
        shims.append(f"{user}: no module {node.module}")
        continue
      own = _defined(target)
      for alias in node.names:
        if (f"{node.module}.{alias.name}" not in modules
            and alias.name not in own):
          shims.append(f"{user}: {node.module}.{alias.name}")
  assert not shims, "\n".join(shims)


# The stages in the order data flows through them, upstream first: a module
# may import its own stage and the stages before it, never one after
# (lazy, function-level imports included). The shared helpers come first;
# config_lib assembles every stage's defaults into presets, so it sits above
# the stages; the command lines (main, predict) and the package's public
# API ("": albert_jax/__init__.py) last.
STAGES = (("hints", "retry", "storage", "tree", "sharding"), ("text",), ("data",),
          ("ops",), ("model",), ("training",), ("interop",), ("finetune",),
          ("config_lib",), ("tools",), ("main", "predict"), ("",))


def _stage(module: str) -> int | None:
  """The index in STAGES of a package module's stage (None: in none)."""
  parts = module.split(".")
  name = parts[1] if len(parts) > 1 else ""
  return next((i for i, names in enumerate(STAGES) if name in names), None)


def _upstream_imports(modules) -> tuple[list[str], list[str]]:
  """(imports of a later stage, modules in no stage)."""
  upstream, unplaced = [], []
  for name, tree in modules.items():
    mine = _stage(name)
    if mine is None:
      unplaced.append(name)
      continue
    for target in sorted(_edges(name, tree, modules)):
      theirs = _stage(target)
      if theirs is not None and theirs > mine:
        upstream.append(f"{name} imports {target}")
  return upstream, unplaced


def test_stages_import_only_downstream():
  upstream, unplaced = _upstream_imports(_modules())
  assert not unplaced, f"place these in STAGES: {unplaced}"
  assert not upstream, "\n".join(upstream)


def test_an_upstream_import_is_caught():
  modules = {
      "albert_jax.text.tokenizer": ast.parse(
          "def f():\n  from albert_jax.data import loader\n"),
      "albert_jax.data.loader": ast.parse("import albert_jax.text.tokenizer\n"),
      "albert_jax.widgets": ast.parse(""),
  }
  assert _upstream_imports(modules) == (
      ["albert_jax.text.tokenizer imports albert_jax.data.loader"],
      ["albert_jax.widgets"])


FAMILIES = "albert_jax.finetune.tasks."


def _family_imports(modules) -> list[str]:
  """Imports that break the task families' isolation: outside the families,
  a module reaches them only through the registry (by name, in
  `registry.FAMILIES`), so no generic code asks which kind a task is; a
  family may build on another's base (a new classification family on
  `classification.single_label`), never on the run, serving or registry
  built on top of them all."""
  bad = []
  for name, tree in modules.items():
    family = name.startswith(FAMILIES)
    for target in sorted(_edges(name, tree, modules)):
      if target.startswith(FAMILIES):
        if not family:
          bad.append(f"{name} imports {target}")
      elif family and target.startswith(
          ("albert_jax.finetune.serving", "albert_jax.finetune.run",
           "albert_jax.finetune.registry")):
        bad.append(f"{name} imports {target}")
  return bad


def test_task_families_are_reached_only_through_the_registry():
  from albert_jax.finetune import registry  # pylint: disable=g-import-not-at-top
  modules = _modules()
  assert not _family_imports(modules), "\n".join(_family_imports(modules))
  # Every family folder is registered, and every registered one exists.
  folders = {n[len(FAMILIES):] for n in modules
             if n.startswith(FAMILIES) and n.count(".") == 3}
  assert {f[len(FAMILIES):] for f in registry.FAMILIES} == folders


def test_a_family_import_from_outside_is_caught():
  modules = {
      "albert_jax.finetune.run": ast.parse(
          "from albert_jax.finetune.tasks.squad import task\n"),
      "albert_jax.finetune.tasks.squad.task": ast.parse(
          "from albert_jax.finetune.tasks.tagging import ner\n"
          "from albert_jax.finetune.tasks.squad import head\n"
          "from albert_jax.finetune import registry\n"),
      "albert_jax.finetune.registry": ast.parse(""),
      "albert_jax.finetune.tasks.squad.head": ast.parse(""),
      "albert_jax.finetune.tasks.tagging.ner": ast.parse(
          "def f():\n  from albert_jax.finetune.serving import fine_tuned\n"),
      "albert_jax.finetune.serving.fine_tuned": ast.parse(""),
  }
  assert _family_imports(modules) == [
      "albert_jax.finetune.run imports albert_jax.finetune.tasks.squad.task",
      "albert_jax.finetune.tasks.squad.task imports "
      "albert_jax.finetune.registry",
      "albert_jax.finetune.tasks.tagging.ner imports "
      "albert_jax.finetune.serving.fine_tuned"]


# Where a run's config becomes the sections and typed objects the stages
# take: these modules may take the whole config (`config`) and read any of
# its fields. Every other module is a stage: a function of it with a
# parameter `config` reads at most one top-level section or field of a run's
# config (`config.optimizer`, `config.seed`), so what a stage reads is in
# its signature.
DRIVERS = {
    "albert_jax.main": "the command line: loads, checks and runs a config",
    "albert_jax.training.pretrain": "runs a pre-training config",
    "albert_jax.finetune.run": "runs a fine-tuning config",
    "albert_jax.finetune.after_pretraining": "runs a pre-training config's "
                                             "fine-tuning stage",
    "albert_jax.training.run_setup": "what every run does around loop.fit",
    "albert_jax.training.run_spec": "a pre-training config → its RunSpec",
    "albert_jax.training.config_check": "checks every field of a config",
    "albert_jax.training.recipe": "records and compares every field",
    "albert_jax.training.defaults": "fills in every field a config lacks",
    "albert_jax.tools.sweep": "runs a config per point of a sweep",
    "albert_jax.tools.summary": "describes a whole config",
    "albert_jax.tools.report": "reports on a run's recorded config",
    "albert_jax.tools.cross_eval": "evaluates by a run's recorded config",
    "albert_jax.tools.compile_only": "--compile_only's run: main hands it "
                                     "the config, as it does pretrain.run",
}
# Functions of stage modules that are drivers themselves.
DRIVER_FUNCTIONS = {
    "albert_jax.tools.compile_targets.for_config": (
        "the dispatcher: a config → pretrain's RunSpec or finetune's "
        "sections"),
    "albert_jax.interop.workdir.load": (
        "a workdir's recorded config.json → its model, through run_spec"),
}
# And every `from_config`: a stage's typed options (loop.LoopOptions,
# starting_point.StartOptions, ...), built from the config once, by the
# stage that owns them.
BUILDERS = "from_config"


def _top_level_fields() -> set[str]:
  """The top-level sections and fields of every shipped config."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from locations import CONFIGS  # pylint: disable=g-import-not-at-top
  fields = set()
  for path in sorted(CONFIGS.glob("*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fields |= set(module.get_config(None).keys())
  return fields


def _functions(node, prefix=""):
  """(qualified name, def) of every function in `node`, methods and nested
  functions included."""
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
      yield prefix + child.name, child
      yield from _functions(child, f"{prefix}{child.name}.")
    elif isinstance(child, ast.ClassDef):
      yield from _functions(child, f"{prefix}{child.name}.")


def _config_reads(fn) -> set[str]:
  """The names `fn` reads off its `config`: config.X, config["X"],
  config.get("X"), getattr(config, "X")."""
  def is_config(n):
    return isinstance(n, ast.Name) and n.id == "config"

  def constant(n):
    return n.value if isinstance(n, ast.Constant) and isinstance(
        n.value, str) else None

  names = set()
  for n in ast.walk(fn):
    if isinstance(n, ast.Attribute) and is_config(n.value):
      names.add(n.attr)
    elif isinstance(n, ast.Subscript) and is_config(n.value):
      names.add(constant(n.slice))
    elif isinstance(n, ast.Call) and n.args:
      f = n.func
      if (isinstance(f, ast.Attribute) and f.attr == "get"
          and is_config(f.value)):
        names.add(constant(n.args[0]))
      elif (isinstance(f, ast.Name) and f.id == "getattr"
            and is_config(n.args[0]) and len(n.args) > 1):
        names.add(constant(n.args[1]))
  names.discard(None)
  return names


def _whole_config_readers(modules, fields: set[str]) -> list[str]:
  """Stage functions that take a `config` and read more than one of its
  top-level `fields`, as "module.function: fields"."""
  bad = []
  for name, tree in modules.items():
    if name in DRIVERS:
      continue
    for qualname, fn in _functions(tree):
      if (fn.name == BUILDERS
          or f"{name}.{qualname}" in DRIVER_FUNCTIONS):
        continue
      args = fn.args
      if "config" not in {a.arg for a in (args.posonlyargs + args.args
                                          + args.kwonlyargs)}:
        continue
      read = sorted(_config_reads(fn) & fields)
      if len(read) > 1:
        bad.append(f"{name}.{qualname}: {', '.join(read)}")
  return bad


def test_stages_take_their_section_not_the_whole_config():
  """Below the drivers, a stage takes its section of the config or a typed
  object built from it: `optimizer.make(config.optimizer,
  config.num_train_steps)`, `loop.fit(LoopOptions.from_config(config),
  plan)`, not `make(config)`."""
  bad = _whole_config_readers(_modules(), _top_level_fields())
  assert not bad, ("take the section, or a typed object built by a "
                   "`from_config`:\n" + "\n".join(bad))


def test_a_stage_reading_the_whole_config_is_caught():
  fields = {"optimizer", "num_train_steps", "data", "seed"}
  modules = {
      "albert_jax.training.optimizer": ast.parse(
          "def make(config, model_config=None):\n"
          "  o = config.optimizer\n"
          "  return o, config['num_train_steps']\n"
          "def make_ok(config, num_train_steps):\n"
          "  return config.name, config.b1, num_train_steps\n"),
      "albert_jax.data.pipeline": ast.parse(
          "class Options:\n"
          "  @classmethod\n"
          "  def from_config(cls, config):\n"
          "    return cls(config.data, config.seed)\n"
          "  def __init__(self, config):\n"
          "    self.seed = getattr(config, 'seed')\n"
          "    def inner():\n"
          "      return config.get('data')\n"),
      "albert_jax.training.pretrain": ast.parse(
          "def run(config):\n  return config.data, config.seed\n"),
      "albert_jax.tools.compile_targets": ast.parse(
          "def for_config(config):\n  return config.data, config.seed\n"),
  }
  assert _whole_config_readers(modules, fields) == [
      "albert_jax.training.optimizer.make: num_train_steps, optimizer",
      "albert_jax.data.pipeline.Options.__init__: data, seed"]
