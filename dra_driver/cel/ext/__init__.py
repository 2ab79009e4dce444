"""Value libraries of Kubernetes' CEL environment that the core interpreter does not define itself.

Each module holds plain value classes, parse functions raising an `ExtError` with Kubernetes' / cel-go's text,
and a table of `ExtOverload`s for the interpreter and the type checker to register (see `table.py`).
"""

from __future__ import annotations

from typing import Final

from dra_driver.cel.ext.formats import FORMAT_OVERLOADS, FORMAT_TYPE, FORMATS, NamedFormat
from dra_driver.cel.ext.net import CIDR, CIDR_TYPE, IP, IP_TYPE, NET_OVERLOADS, NetError, parse_cidr, parse_ip
from dra_driver.cel.ext.table import ExtError, ExtOverload, resolve
from dra_driver.cel.ext.timeutil import (
    DURATION_TYPE,
    TIME_OVERLOADS,
    TIMESTAMP_TYPE,
    Duration,
    TimeError,
    Timestamp,
    parse_duration,
    parse_timestamp,
)
from dra_driver.cel.ext.urls import URL, URL_OVERLOADS, URL_TYPE, URLError, parse_url

OVERLOADS: Final[tuple[ExtOverload, ...]] = NET_OVERLOADS + URL_OVERLOADS + TIME_OVERLOADS + FORMAT_OVERLOADS
# CEL type names of the ext value classes, as `type(x)` and error messages print them.
TYPE_NAMES: Final[dict[type, str]] = {
    IP: IP_TYPE,
    CIDR: CIDR_TYPE,
    URL: URL_TYPE,
    Timestamp: TIMESTAMP_TYPE,
    Duration: DURATION_TYPE,
    NamedFormat: FORMAT_TYPE,
}


def call(function: str, member: bool, *args: object) -> object:
    """Run the overload matching the runtime argument types; `None`-free: raises `ExtError` for CEL errors."""
    overload = resolve(OVERLOADS, function, member, args, TYPE_NAMES)
    if overload is None:
        raise ExtError("no such overload")
    return overload.impl(*args)


__all__ = [
    "CIDR",
    "FORMATS",
    "FORMAT_OVERLOADS",
    "IP",
    "OVERLOADS",
    "TYPE_NAMES",
    "URL",
    "Duration",
    "ExtError",
    "ExtOverload",
    "NamedFormat",
    "NetError",
    "TimeError",
    "Timestamp",
    "URLError",
    "call",
    "parse_cidr",
    "parse_duration",
    "parse_ip",
    "parse_timestamp",
    "parse_url",
    "resolve",
]
