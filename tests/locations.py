"""Paths the tests share: the repository, its bundled data and test data.

Importable from every test folder (pytest puts tests/, the folder of the
root conftest.py, on sys.path).
"""

import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
TESTDATA = TESTS / "testdata"
CONFIGS = REPO / "configs"
EXPERIMENTS = REPO / "experiments"
# The bundled corpus: State of the Union addresses, a sentence per line.
CORPUS = REPO / "albert_jax" / "data" / "bundled" / "corpus" / "sotu.txt.gz"
# A pre-trained SentencePiece model (T5's C4 32k vocabulary).
T5_SPM = TESTDATA / "t5_c4_32k.model"
