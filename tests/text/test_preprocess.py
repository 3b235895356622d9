"""`albert_jax.text.preprocess.preprocess_text`: the ASCII fast path gives
what ALBERT's accent stripping gives."""

import string
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from albert_jax.text import preprocess


def _official(text, do_lower_case=True):
  """ALBERT's preprocess_text (with HF's quote rewrite), accents stripped
  for every text."""
  out = " ".join(text.strip().split())
  out = out.replace("``", '"').replace("''", '"')
  out = unicodedata.normalize("NFKD", out)
  out = "".join(c for c in out if not unicodedata.combining(c))
  return out.lower() if do_lower_case else out


@given(st.one_of(st.text(alphabet=string.printable),
                 st.text(alphabet=string.printable + "éÅñ\u0301ﬁ²½"),
                 st.text()),
       st.booleans())
def test_matches_official_accent_stripping(text, lower):
  assert preprocess.preprocess_text(text, lower) == _official(text, lower)


def test_examples():
  assert preprocess.preprocess_text("  Café  ``Noël''\tﬁ ") == 'cafe "noel" fi'
  assert preprocess.preprocess_text("Café", keep_accents=True) == "café"
