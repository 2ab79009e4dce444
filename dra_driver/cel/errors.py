"""Exceptions of the CEL package.

`CelCompileError` and `CelRuntimeError` are the public ones; `EvalError` is raised inside the interpreter and is
turned into a `CelRuntimeError` at the program boundary, so `&&`/`||` can absorb it (CEL's commutative error
semantics) without catching unrelated Python exceptions.
"""

from __future__ import annotations


class CelError(Exception):
    """Base of every error this package raises on purpose."""


class CelCompileError(CelError):
    """The expression does not parse, does not type-check, or breaks a Kubernetes limit."""


class CelRuntimeError(CelError):
    """Evaluation failed (missing key, overflow, no matching overload, cost limit, non-bool result...)."""


class EvalError(Exception):
    """An error value produced while evaluating; `message` follows cel-go's wording where we know it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EvaluationAborted(EvalError):
    """Not absorbable by `&&`/`||` (nor by anything else): the whole evaluation stops."""


class GoPanic(EvaluationAborted):
    """A Go runtime panic inside cel-go's evaluation, which cel-go recovers into an "internal error"."""

    def __init__(self, message: str) -> None:
        super().__init__(f"internal error: runtime error: {message}")


class CostLimitExceeded(EvaluationAborted):
    """cel-go cancels the whole evaluation."""

    def __init__(self) -> None:
        super().__init__("operation cancelled: actual cost limit exceeded")
