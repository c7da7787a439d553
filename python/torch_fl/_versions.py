"""The torch releases torch-fl supports, stated once.

Everything else reads these constants: ``_shim.check_supported`` (the error
at import), ``torch_fl info``, the Makefile's ``test-torch`` (this file run
as a script; it imports nothing, so it runs without torch installed), and
``tests/test_torch_versions.py``, which checks that ``pyproject.toml``'s
dependency and the README's statements of the range equal them.

``python3 python/torch_fl/_versions.py`` prints the range (``2.13 to
2.15``); with a version argument it exits 1, naming the range, when that
version is outside it.
"""

from __future__ import annotations

import re
import sys

#: The oldest supported torch release (major, minor).
MIN_TORCH = (2, 13)
#: The first unsupported release after the range: ``MIN_TORCH <= release < END_TORCH``.
END_TORCH = (2, 16)
#: The newest supported release (``END_TORCH`` less one minor version).
MAX_TORCH = (END_TORCH[0], END_TORCH[1] - 1)
#: The range as a pip requirement specifier (``pyproject.toml``: ``torch`` plus this).
SPECIFIER = f">={MIN_TORCH[0]}.{MIN_TORCH[1]},<{END_TORCH[0]}.{END_TORCH[1]}"
#: The requirement ``pyproject.toml`` lists.
REQUIREMENT = f"torch{SPECIFIER}"


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of ``version``: ``2.15.0rc1`` and ``2.16.0a0`` count as the release they lead to."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() != len(piece):
            break
    return tuple(parts)


def is_supported(version: str) -> bool:
    """Whether torch ``version`` (``2.14.1``, ``2.15.0rc1``, ``2.14.1+cu130``) is in the supported range."""
    return MIN_TORCH <= release(version)[:2] < END_TORCH


def supported_minors() -> list[str]:
    """Every supported release as ``major.minor``, oldest first (same major version)."""
    return [f"{MIN_TORCH[0]}.{minor}" for minor in range(MIN_TORCH[1], END_TORCH[1])]


def describe() -> str:
    """The range in words: ``2.13 to 2.15``."""
    return f"{MIN_TORCH[0]}.{MIN_TORCH[1]} to {MAX_TORCH[0]}.{MAX_TORCH[1]}"


def enumerate_releases() -> str:
    """Every supported release in prose: ``2.13, 2.14 and 2.15``."""
    minors = supported_minors()
    return minors[0] if len(minors) == 1 else f"{', '.join(minors[:-1])} and {minors[-1]}"


def _main(argv: list[str]) -> int:
    if not argv:
        print(describe())
        return 0
    outside = [v for v in argv if not is_supported(v)]
    for version in outside:
        print(f"torch {version} is outside the supported range, torch {describe()} ({REQUIREMENT})", file=sys.stderr)
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
