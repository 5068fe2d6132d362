"""No Python string in fastcoll/ longer than 30 lines: code in another language (the gate's
kernels) lives in files of its own, shipped as package data, and docstrings stay short."""

from __future__ import annotations

import ast
import glob
import os

from conftest import ROOT

MAX_LINES = 30


def long_strings(source: str) -> list[tuple[int, int]]:
    """(line, length in lines) of each string in `source` longer than MAX_LINES lines: docstrings,
    literals (adjacent ones joined, as Python joins them) and the pieces of f-strings alike."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            lines = node.value.count("\n") + 1
            if lines > MAX_LINES:
                found.append((node.lineno, lines))
    return found


def test_no_string_in_the_package_is_longer_than_30_lines():
    files = glob.glob(os.path.join(ROOT, "fastcoll", "**", "*.py"), recursive=True)
    assert len(files) > 50  # the package itself, not an empty glob
    long = []
    for path in files:
        with open(path) as f:
            long += [f"{os.path.relpath(path, ROOT)}:{line}: {n} lines" for line, n in long_strings(f.read())]
    assert not long, long


def test_a_long_string_is_seen_wherever_it_is():
    body = "\n".join(f"line {i}" for i in range(MAX_LINES))  # exactly MAX_LINES lines: allowed
    assert long_strings(f'x = """{body}"""\n') == []
    longer = body + "\none more"
    assert long_strings(f'"""{longer}"""\n') == [(1, MAX_LINES + 1)]  # a docstring
    assert long_strings(f'def f():\n    return f"""{{f}}{longer}"""\n') == [(2, MAX_LINES + 1)]  # an f-string's piece
    assert long_strings("y = (" + " ".join(f"'{i}\\n'" for i in range(MAX_LINES + 1)) + ")\n") == [(1, MAX_LINES + 2)]
