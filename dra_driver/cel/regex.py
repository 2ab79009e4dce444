"""Regular expressions with Go's `regexp` syntax (what cel-go and Kubernetes use), run by RE2.

RE2 and Go's parser agree except in a few corners (Go rejects `\\C`); errors are worded as Go's
`error parsing regexp: ...`. RE2's own error logging to stderr is turned off. The RE2 module is loaded with the first
pattern (memory of the node daemon that most nodes' selectors never need).
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from typing import Any, Final

_ANY_BYTE: Final = re.compile(r"(?<!\\)(?:\\\\)*\\C")
_GO_WORDING: Final = (
    (re.compile(r"^missing \): (.*)$", re.S), "missing closing ): `{}`"),
    (re.compile(r"^missing \]: (.*)$", re.S), "missing closing ]: `{}`"),
    (re.compile(r"^bad repetition operator: (.*)$", re.S), "invalid nested repetition operator: `{}`"),
    (re.compile(r"^invalid repetition size: (.*)$", re.S), "invalid repeat count: `{}`"),
    (re.compile(r"^invalid escape sequence: (.*)$", re.S), "invalid escape sequence: `{}`"),
)


class RegexError(ValueError):
    pass


@cache
def _re2() -> tuple[Any, Any, Any]:
    """(the module, its options, the unanchored anchor value or None)."""
    import re2  # type: ignore[import-untyped]

    options = re2.Options()
    options.log_errors = False
    return re2, options, getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)


def _go_message(detail: str) -> str:
    for pattern, template in _GO_WORDING:
        match = pattern.match(detail)
        if match:
            return "error parsing regexp: " + template.format(match.group(1))
    return f"error parsing regexp: {detail}"


@lru_cache(maxsize=512)
def compile_go_regex(pattern: str) -> Any:
    """A compiled RE2 program (cached: selectors reuse a handful of patterns); raises `RegexError`."""
    if _ANY_BYTE.search(pattern):
        raise RegexError(_go_message("invalid escape sequence: \\C"))
    re2, options, _ = _re2()
    try:
        return re2.compile(pattern, options)
    except re2.error as err:
        detail = err.args[0].decode() if err.args and isinstance(err.args[0], bytes) else str(err)
        raise RegexError(_go_message(detail)) from None


def regex_search(program: Any, text: str) -> bool:
    """Whether `program` (from `compile_go_regex`) matches anywhere in `text`. The wrapper's `search` builds a Match
    and maps byte offsets back to characters (~4x the cost of the match itself, and `matches` was the slowest cold
    selector); a yes/no needs neither, so call the RE2 program directly when this google-re2 exposes it."""
    raw = getattr(program, "_regexp", None)
    unanchored = _re2()[2]
    if raw is None or unanchored is None:
        return program.search(text) is not None
    encoded = text.encode()
    return bool(raw.Match(unanchored, encoded, 0, len(encoded))[0][0] != -1)


def regex_error(pattern: str) -> str | None:
    try:
        compile_go_regex(pattern)
    except RegexError as err:
        return str(err)
    return None
