"""No pickle anywhere: a syntax-tree scan of every module the project ships.

Unpickling runs arbitrary code, so a checkpoint, dataset or download read
with pickle is a way in. The scan parses each .py file under albert_jax/,
experiments/ and configs/ with `ast` (so a mention in a comment, docstring
or string is not a use) and flags:

  - importing pickle, cPickle, _pickle, dill, cloudpickle or shelve;
  - `torch.load(...)` (under any alias) without `weights_only=True`;
  - `numpy.load(...)` / `np.load(...)` with `allow_pickle` set to anything
    but False;
  - `joblib.load(...)`, and pandas' `read_pickle` / `to_pickle`.

A self-test runs the scanner on synthetic snippets, offending and innocent,
so a scanner that flags nothing cannot pass.
"""

import ast
import os

from locations import REPO
import pytest

SCANNED = ("albert_jax", "experiments", "configs")
PICKLE_MODULES = frozenset(
    {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve"})
PICKLE_METHODS = frozenset({"read_pickle", "to_pickle"})


def _root(name: str) -> str:
  return name.split(".")[0]


class _Scanner(ast.NodeVisitor):
  """Collects (line, message) for every pickle use in one module."""

  def __init__(self):
    self.found: list[tuple[int, str]] = []
    # Local name → the module (or module.function) it stands for.
    self.aliases: dict[str, str] = {}

  def flag(self, node, message):
    self.found.append((node.lineno, message))

  def visit_Import(self, node):
    for alias in node.names:
      if _root(alias.name) in PICKLE_MODULES:
        self.flag(node, f"imports {alias.name}")
      local = alias.asname or _root(alias.name)
      self.aliases[local] = alias.name if alias.asname else _root(alias.name)
    self.generic_visit(node)

  def visit_ImportFrom(self, node):
    module = node.module or ""
    if _root(module) in PICKLE_MODULES:
      self.flag(node, f"imports from {module}")
    for alias in node.names:
      self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    self.generic_visit(node)

  def _dotted(self, node) -> str | None:
    """`a.b.c` with `a` resolved through the imports, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
      parts.append(node.attr)
      node = node.value
    if not isinstance(node, ast.Name):
      return None
    head = self.aliases.get(node.id, node.id)
    return ".".join([head] + parts[::-1])

  def visit_Attribute(self, node):
    name = self._dotted(node)
    if name and _root(name) in PICKLE_MODULES:
      self.flag(node, f"uses {name}")
    self.generic_visit(node)

  def visit_Call(self, node):
    name = self._dotted(node.func) or ""
    keywords = {k.arg: k.value for k in node.keywords if k.arg}

    def literal(key):
      value = keywords.get(key)
      return value.value if isinstance(value, ast.Constant) else value

    if name == "torch.load" and literal("weights_only") is not True:
      self.flag(node, "torch.load without weights_only=True")
    if name == "numpy.load" and "allow_pickle" in keywords and (
        literal("allow_pickle") is not False):
      self.flag(node, "numpy.load with allow_pickle")
    if name == "joblib.load":
      self.flag(node, "joblib.load")
    if isinstance(node.func, ast.Attribute) and (
        node.func.attr in PICKLE_METHODS):
      self.flag(node, f".{node.func.attr}()")
    self.generic_visit(node)


def scan_source(source: str, filename: str = "<snippet>"
                ) -> list[tuple[int, str]]:
  """(line, what) for every pickle use in a module's source."""
  scanner = _Scanner()
  scanner.visit(ast.parse(source, filename))
  return sorted(scanner.found)


def project_files() -> list[str]:
  files = []
  for top in SCANNED:
    for root, dirs, names in os.walk(os.path.join(REPO, top)):
      dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
      files += [os.path.join(root, n) for n in names if n.endswith(".py")]
  return sorted(files)


@pytest.mark.parametrize("snippet, expected", [
    ("import pickle\n", "imports pickle"),
    ("import cPickle as p\n", "imports cPickle"),
    ("from dill import loads\n", "imports from dill"),
    ("import cloudpickle\n", "imports cloudpickle"),
    ("import shelve\n", "imports shelve"),
    ("def f(x):\n  import _pickle\n  return _pickle.loads(x)\n",
     "uses _pickle.loads"),
    ("import torch\nw = torch.load('m.bin')\n",
     "torch.load without weights_only=True"),
    ("import torch as th\nw = th.load(f, map_location='cpu')\n",
     "torch.load without weights_only=True"),
    ("from torch import load\nw = load(f, weights_only=False)\n",
     "torch.load without weights_only=True"),
    ("import torch\nw = torch.load(f, weights_only=flag)\n",
     "torch.load without weights_only=True"),
    ("import numpy as np\na = np.load('x.npy', allow_pickle=True)\n",
     "numpy.load with allow_pickle"),
    ("import numpy\na = numpy.load(f, allow_pickle=ok)\n",
     "numpy.load with allow_pickle"),
    ("import joblib\nm = joblib.load('m.joblib')\n", "joblib.load"),
    ("import pandas as pd\nd = pd.read_pickle('d.pkl')\n", ".read_pickle()"),
])
def test_scanner_flags_offending_snippets(snippet, expected):
  found = scan_source(snippet)
  assert any(what == expected for _, what in found), found


@pytest.mark.parametrize("snippet", [
    "# import pickle\nx = 1\n",
    '"""We never import pickle or call torch.load(f)."""\n',
    "message = 'np.load(f, allow_pickle=True) is refused'\n",
    "import torch\nw = torch.load(f, weights_only=True)\n",
    "import torch\nw = torch.load(f, map_location='cpu', weights_only=True)\n",
    "import numpy as np\na = np.load('x.npz')\n",
    "import numpy as np\na = np.load('x.npz', allow_pickle=False)\n",
    "import json\nd = json.load(f)\n",
    "pickled = 3\npickle_free = pickled + 1\n",
])
def test_scanner_passes_innocent_snippets(snippet):
  assert scan_source(snippet) == []


def test_scanner_reports_lines():
  source = "import os\n\nimport numpy as np\nx = np.load(p, allow_pickle=1)\n"
  assert scan_source(source) == [(4, "numpy.load with allow_pickle")]


def test_no_pickle_in_the_project():
  files = project_files()
  # The scan covers the package's modules (a sanity check on the walk).
  names = {os.path.relpath(f, REPO) for f in files}
  assert {"albert_jax/training/checkpoints.py", "albert_jax/interop/hf.py",
          "albert_jax/data/loader.py"} <= names, sorted(names)[:20]
  offences = []
  for path in files:
    with open(path, encoding="utf-8") as f:
      source = f.read()
    for line, what in scan_source(source, path):
      offences.append(f"{os.path.relpath(path, REPO)}:{line}: {what}")
  assert not offences, "\n".join(offences)
