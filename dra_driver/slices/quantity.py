"""Kubernetes quantities in canonical form, so what we publish is what the API server stores."""

from __future__ import annotations

_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def binary_quantity(n: int) -> str:
    """Bytes as the API server canonicalises a BinarySI quantity: the largest exact suffix."""
    if n < 0:
        raise ValueError(f"negative quantity {n}")
    if n == 0:
        return "0"
    suffix = ""
    for s in _BINARY_SUFFIXES:
        if n % 1024:
            break
        n //= 1024
        suffix = s
    return f"{n}{suffix}"


def count_quantity(n: int) -> str:
    if n < 0:
        raise ValueError(f"negative quantity {n}")
    return str(n)
