"""`regex_search`, the yes/no RE2 match behind `matches()`: the same answers as google-re2's `search`."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.cel.regex import compile_go_regex, regex_search


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("h100|h200", "nvidia h100 80gb"),
        ("h100|h200", "nvidia a100"),
        ("^$", ""),
        ("x*", "abc"),  # the empty match at 0
        ("é.$", "café!"),  # non-ASCII: bytes, not characters, go to RE2
        ("^caf.!$", "café!"),  # `.` is one character, not one byte
        ("(?i)GPU-[0-9a-f]{8}", "gpu-deadbeef"),
        ("b$", "a\nb"),
    ],
)
def test_regex_search_agrees_with_re2_search(pattern: str, text: str) -> None:
    program = compile_go_regex(pattern)
    assert regex_search(program, text) is (program.search(text) is not None)


def test_regex_search_falls_back_to_search_without_the_raw_program() -> None:
    class Wrapped:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def search(self, text: str) -> Any:
            return self.inner.search(text)

    program = Wrapped(compile_go_regex("a+b"))
    assert regex_search(program, "xxaab") is True
    assert regex_search(program, "xxba") is False
