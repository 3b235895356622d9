"""One "did you mean" for every name a user can misspell: config keys and
their choices, task names, table columns, suites.

A hint names the closest valid names, case aside, as Python literals:
" (did you mean 'regression'?)", or " (did you mean 'a', 'b' or 'c'?)"
with several; nothing when no name is close. Every message that offers one goes
through here, so they read alike and match alike.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence


def closest(name: object, choices: Iterable[object], n: int = 1,
            cutoff: float = 0.6) -> list[str]:
  """Up to `n` of `choices` closest to `name` (difflib's ratio of at least
  `cutoff`, compared case-folded), best first, spelt as in `choices`."""
  folded: dict[str, str] = {}
  for choice in choices:
    folded.setdefault(str(choice).casefold(), str(choice))
  found = difflib.get_close_matches(str(name).casefold(), list(folded), n=n,
                                    cutoff=cutoff)
  return [folded[f] for f in found]


def suggestion(close: Sequence[str]) -> str:
  """" (did you mean 'a', 'b' or 'c'?)" naming `close`, or "" for none."""
  names = [repr(c) for c in close]
  if not names:
    return ""
  listed = names[-1] if len(names) == 1 else (
      ", ".join(names[:-1]) + " or " + names[-1])
  return f" (did you mean {listed}?)"


def did_you_mean(name: object, choices: Iterable[object], n: int = 1,
                 cutoff: float = 0.6) -> str:
  """`suggestion` of `closest`'s names, or "" when none is close."""
  return suggestion(closest(name, choices, n, cutoff))
