"""The examples of docs/python.md that are marked to run do run: each ```python block right
after the line `<!-- runs as a test: bindings/python/tests/test_docs.py -->` is executed as it
is written (its own asserts are the checks), so the page cannot drift from the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "python.md"
MARK = "<!-- runs as a test: bindings/python/tests/test_docs.py -->"


def marked_blocks(text: str) -> list[str]:
    """The code of every ```python block that directly follows the marker line."""
    pattern = re.escape(MARK) + r"\s*\n```python\n(.*?)\n```"
    return re.findall(pattern, text, flags=re.DOTALL)


def test_the_page_has_marked_examples():
    text = PAGE.read_text()
    assert text.count(MARK) == len(marked_blocks(text)) >= 1, "a marker without its block"


@pytest.mark.parametrize("index", range(len(marked_blocks(PAGE.read_text()))))
def test_marked_example_runs(index):
    code = marked_blocks(PAGE.read_text())[index]
    exec(compile(code, f"{PAGE}:example{index}", "exec"), {"__name__": "__docs__"})


def test_a_failing_example_would_fail():
    """The runner does not swallow errors: a block whose assert fails raises."""
    block = f"{MARK}\n```python\nassert 1 == 2, 'docs example failed'\n```\n"
    (code,) = marked_blocks(block)
    with pytest.raises(AssertionError, match="docs example failed"):
        exec(compile(code, "example", "exec"), {})
