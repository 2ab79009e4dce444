"""cel-go's standard `google.protobuf.Timestamp` and `google.protobuf.Duration` values and overloads.

Parsing follows Go's time.Parse(time.RFC3339, ...) (its fast path and the lenient generic fallback together) and
time.ParseDuration, whose acceptance differs from Python's `datetime`; calendar fields are computed here because
a timestamp shifted into a time zone may fall in year 0 or 10000, which `datetime` cannot hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Final
from zoneinfo import ZoneInfo

from dra_driver.cel.ext.table import ExtError, ExtOverload, go_quote

TIMESTAMP_TYPE: Final = "google.protobuf.Timestamp"
DURATION_TYPE: Final = "google.protobuf.Duration"
_NANOS: Final = 1_000_000_000
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
MIN_UNIX: Final = -62135596800  # 0001-01-01T00:00:00Z
MAX_UNIX: Final = 253402300799  # 9999-12-31T23:59:59Z
_OVERFLOW: Final = "integer overflow"
_TS_OVERFLOW: Final = "timestamp overflow"

# Union of time.Parse(RFC3339)'s fast path and its generic layout parser: one-digit hours, ',' before the fraction
# and a zone offset up to 24:60 only pass the latter.
_RFC3339: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]+))?(Z|[+-][0-9]{2}:[0-9]{2})",
    re.ASCII,
)
# time.ParseDuration's units; "µs" is U+00B5 (micro sign), "μs" U+03BC (Greek mu).
_UNITS: Final = {
    "ns": 1,
    "us": 1000,
    "µs": 1000,
    "μs": 1000,
    "ms": 10**6,
    "s": _NANOS,
    "m": 60 * _NANOS,
    "h": 3600 * _NANOS,
}


class TimeError(ExtError):
    """A timestamp or duration error value (conversion, overflow, bad time zone)."""


def _check_int(value: int) -> int:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise TimeError(_OVERFLOW)
    return value


def _days_in(month: int, year: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


class Duration:
    """A Go time.Duration: signed int64 nanoseconds."""

    __slots__ = ("nanos",)

    def __init__(self, nanos: int) -> None:
        self.nanos = _check_int(nanos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and self.nanos == other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __lt__(self, other: Duration) -> bool:
        return self.nanos < other.nanos

    def __repr__(self) -> str:
        return f"duration({str(self)!r})"

    def __str__(self) -> str:
        """cel-go: strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"."""
        return _format_float(self._float(_NANOS)) + "s"

    def compare(self, other: Duration) -> int:
        return (self.nanos > other.nanos) - (self.nanos < other.nanos)

    @classmethod
    def from_proto(cls, seconds: int, nanos: int) -> Duration:
        """durationpb's AsDuration, as cel-go converts a `google.protobuf.Duration` message: beyond the int64
        nanoseconds of a Go time.Duration it saturates by the sign of `seconds`."""
        total = seconds * _NANOS + nanos
        if not _INT64_MIN <= seconds * _NANOS <= _INT64_MAX or not _INT64_MIN <= total <= _INT64_MAX:
            if seconds:
                return cls(_INT64_MAX if seconds > 0 else _INT64_MIN)
            return cls(total)  # nanos alone (an int32) always fit
        return cls(total)

    def _float(self, unit: int) -> float:
        """Go's Hours()/Minutes()/Seconds(): whole units plus the float remainder, truncating division."""
        whole = abs(self.nanos) // unit * (1 if self.nanos >= 0 else -1)
        return float(whole) + float(self.nanos - whole * unit) / float(unit)

    def hours(self) -> int:
        return int(self._float(3600 * _NANOS))

    def minutes(self) -> int:
        return int(self._float(60 * _NANOS))

    def seconds(self) -> int:
        return int(self._float(_NANOS))

    def milliseconds(self) -> int:
        return _trunc_div(self.nanos, 10**6)

    def add(self, other: Duration) -> Duration:
        return Duration(self.nanos + other.nanos)

    def sub(self, other: Duration) -> Duration:
        return Duration(self.nanos - other.nanos)


def _trunc_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _format_float(value: float) -> str:
    """Shortest round-trip digits in plain notation, like Go's FormatFloat(v, 'f', -1, 64)."""
    return format(Decimal(repr(value)).normalize(), "f")


class Timestamp:
    """A Go time.Time in cel-go's range: Unix seconds, nanoseconds and the zone offset it was written with."""

    __slots__ = ("nanos", "offset", "seconds")

    def __init__(self, seconds: int, nanos: int = 0, offset: int = 0) -> None:
        if not MIN_UNIX <= seconds <= MAX_UNIX:
            raise TimeError(_TS_OVERFLOW)
        self.seconds, self.nanos, self.offset = seconds, nanos, offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and (self.seconds, self.nanos) == (other.seconds, other.nanos)

    def __hash__(self) -> int:
        return hash((self.seconds, self.nanos))

    def __lt__(self, other: Timestamp) -> bool:
        return (self.seconds, self.nanos) < (other.seconds, other.nanos)

    def __repr__(self) -> str:
        return f"timestamp({str(self)!r})"

    def __str__(self) -> str:
        """Go's Format(time.RFC3339Nano) in the timestamp's own zone."""
        year, month, day, hour, minute, second = self.fields(self.offset)[:6]
        text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
        if self.nanos:
            text += "." + f"{self.nanos:09d}".rstrip("0")
        if self.offset == 0:
            return text + "Z"
        sign, minutes = ("-" if self.offset < 0 else "+"), abs(self.offset) // 60
        return f"{text}{sign}{minutes // 60:02d}:{minutes % 60:02d}"

    @classmethod
    def from_proto(cls, seconds: int, nanos: int) -> Timestamp:
        """timestamppb's AsTime, as cel-go converts a `google.protobuf.Timestamp` message: Go's time.Unix, which
        carries the nanoseconds into the seconds, with no range check (a literal may lie beyond year 9999)."""
        seconds, nanos = seconds + nanos // _NANOS, nanos % _NANOS
        stamp = object.__new__(cls)
        stamp.seconds, stamp.nanos, stamp.offset = seconds, nanos, 0
        return stamp

    def compare(self, other: Timestamp) -> int:
        left, right = (self.seconds, self.nanos), (other.seconds, other.nanos)
        return (left > right) - (left < right)

    def fields(self, offset: int) -> tuple[int, int, int, int, int, int, int, int]:
        """year, month (1-12), day, hour, minute, second, weekday (0 = Sunday), day of year (1-based) at `offset`."""
        local = self.seconds + offset
        days, rem = divmod(local, 86400)
        year, month, day = _civil_from_days(days)
        yday = days - _days_from_civil(year, 1, 1) + 1
        return year, month, day, rem // 3600, rem % 3600 // 60, rem % 60, (days + 4) % 7, yday

    def add(self, duration: Duration) -> Timestamp:
        """cel-go addTimeDurationChecked: the zone is kept."""
        total = self.seconds * _NANOS + self.nanos + duration.nanos
        seconds, nanos = divmod(total, _NANOS)
        return Timestamp(seconds, nanos, self.offset)

    def sub_duration(self, duration: Duration) -> Timestamp:
        return self.add(Duration(_check_int(-duration.nanos)))

    def sub(self, other: Timestamp) -> Duration:
        return Duration(_check_int((self.seconds - other.seconds) * _NANOS + self.nanos - other.nanos))


def _conversion_error(target: str) -> TimeError:
    return TimeError(f"type conversion error from 'string' to '{target}'")


@lru_cache(maxsize=4096)  # immutable values; devices of a fleet repeat the same strings
def parse_timestamp(text: str) -> Timestamp:
    """cel-go `timestamp(string)`: time.Parse(time.RFC3339), then the 0001..9999 range."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise _conversion_error(TIMESTAMP_TYPE)
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= _days_in(month, year) and hour < 24 and minute < 60 and second < 60):
        raise _conversion_error(TIMESTAMP_TYPE)
    fraction, zone = match.group(7) or "", match.group(8)
    nanos = int(fraction[:9].ljust(9, "0")) if fraction else 0
    offset = 0
    if zone != "Z":
        zone_hours, zone_minutes = int(zone[1:3]), int(zone[4:6])
        if zone_hours > 24 or zone_minutes > 60:
            raise _conversion_error(TIMESTAMP_TYPE)
        offset = (zone_hours * 60 + zone_minutes) * 60 * (-1 if zone[0] == "-" else 1)
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset
    return Timestamp(seconds, nanos, offset)


def timestamp_from_int(seconds: int) -> Timestamp:
    return Timestamp(seconds)


@lru_cache(maxsize=4096)  # immutable values; devices of a fleet repeat the same strings
def parse_duration(text: str) -> Duration:
    """cel-go `duration(string)`: Go's time.ParseDuration, including its float rounding of fractions."""
    nanos = _go_parse_duration(text)
    if nanos is None:
        raise _conversion_error(DURATION_TYPE)
    return Duration(nanos)


def _go_parse_duration(s: str) -> int | None:
    negative = False
    if s[:1] in ("-", "+"):
        negative, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        return None
    total = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            return None
        whole, i = 0, 0
        while i < len(s) and "0" <= s[i] <= "9":
            whole = whole * 10 + ord(s[i]) - 48
            if whole > 1 << 63:
                return None
            i += 1
        pre, s = i > 0, s[i:]
        frac, scale, post = 0, 1.0, False
        if s[:1] == ".":
            s = s[1:]
            i, overflow = 0, False
            while i < len(s) and "0" <= s[i] <= "9":
                if not overflow:
                    nxt = frac * 10 + ord(s[i]) - 48
                    if frac > (2**63 - 1) // 10 or nxt > 1 << 63:
                        overflow = True
                    else:
                        frac, scale = nxt, scale * 10
                i += 1
            post, s = i > 0, s[i:]
        if not pre and not post:
            return None
        i = 0
        while i < len(s) and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        unit = _UNITS.get(s[:i])
        if unit is None:
            return None
        s = s[i:]
        if whole > (1 << 63) // unit:
            return None
        whole *= unit
        if frac > 0:
            whole += int(float(frac) * (float(unit) / scale))
            if whole > 1 << 63:
                return None
        total += whole
        if total > 1 << 63:
            return None
    if negative:
        return -total
    return total if total <= _INT64_MAX else None


# Go's platformZoneSources (zoneinfo_unix.go), searched in this order before its embedded / GOROOT copies.
_ZONE_SOURCES: Final = ("/usr/share/zoneinfo", "/usr/share/lib/zoneinfo", "/usr/lib/locale/TZ", "/etc/zoneinfo")


@lru_cache(maxsize=64)
def _zone(name: str) -> ZoneInfo | None:
    """Go's time.LoadLocation, first error included; None is UTC."""
    if name in ("", "UTC", "Local"):
        return None  # Local: the scheduler's containers run in UTC
    if ".." in name or name[0] in "/\\":
        raise TimeError("time: invalid location name")
    first_error = ""
    for source in _ZONE_SOURCES:
        path = Path(source, name)
        if path.is_dir():
            first_error = first_error or "is a directory"  # Go reports the bare errno of read(2)
        elif path.is_file():
            try:
                with path.open("rb") as data:
                    return ZoneInfo.from_file(data, key=name)
            except (ValueError, OSError):
                first_error = first_error or "malformed time zone information"
    try:
        return ZoneInfo(name)  # the tzdata package: Go's embedded copy when the system has none
    except (ValueError, OSError, KeyError):
        raise TimeError(first_error or f"unknown time zone {name}") from None


def _go_atoi(text: str) -> int:
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        raise TimeError(f"strconv.Atoi: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise TimeError(f"strconv.Atoi: parsing {go_quote(text)}: value out of range")
    return value


def zone_offset(ts: Timestamp, tz: str) -> int:
    """Seconds east of UTC of `tz` at `ts`: an IANA name, or cel-go's "[+-]HH:MM" read as it reads it."""
    colon = tz.find(":")
    if colon < 0:
        zone = _zone(tz)
        if zone is None:
            return 0
        return _zone_offset_at(zone, min(max(ts.seconds, MIN_UNIX + 86400), MAX_UNIX - 86400))
    hours, minutes = _go_atoi(tz[:colon]), _go_atoi(tz[colon + 1 :])
    return (hours * 60 - minutes if tz[0] == "-" else hours * 60 + minutes) * 60


def _zone_offset_at(zone: ZoneInfo, seconds: int) -> int:
    import datetime

    delta = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).astimezone(zone).utcoffset()
    return int(delta.total_seconds()) if delta is not None else 0


def _getter(index: int, adjust: int) -> tuple[Callable[[Timestamp], int], Callable[[Timestamp, str], int]]:
    def utc(ts: Timestamp) -> int:
        return ts.fields(0)[index] + adjust

    def zoned(ts: Timestamp, tz: str) -> int:
        return ts.fields(zone_offset(ts, tz))[index] + adjust

    return utc, zoned


def _ms_utc(ts: Timestamp) -> int:
    return ts.nanos // 10**6


def _ms_zoned(ts: Timestamp, tz: str) -> int:
    zone_offset(ts, tz)  # a bad zone is still an error
    return ts.nanos // 10**6


def _timestamp_getters() -> tuple[ExtOverload, ...]:
    # name, overload-id stem, field index in Timestamp.fields, adjustment to cel-go's numbering
    specs = (
        ("getFullYear", "timestamp_to_year", 0, 0),
        ("getMonth", "timestamp_to_month", 1, -1),
        ("getDayOfYear", "timestamp_to_day_of_year", 7, -1),
        ("getDayOfMonth", "timestamp_to_day_of_month", 2, -1),
        ("getDate", "timestamp_to_day_of_month_1_based", 2, 0),
        ("getDayOfWeek", "timestamp_to_day_of_week", 6, 0),
        ("getHours", "timestamp_to_hours", 3, 0),
        ("getMinutes", "timestamp_to_minutes", 4, 0),
        ("getSeconds", "timestamp_to_seconds", 5, 0),
    )
    out: list[ExtOverload] = []
    for name, stem, index, adjust in specs:
        utc, zoned = _getter(index, adjust)
        out.append(ExtOverload(name, stem, True, (TIMESTAMP_TYPE,), "int", utc))
        out.append(ExtOverload(name, f"{stem}_with_tz", True, (TIMESTAMP_TYPE, "string"), "int", zoned))
    out.append(ExtOverload("getMilliseconds", "timestamp_to_milliseconds", True, (TIMESTAMP_TYPE,), "int", _ms_utc))
    out.append(
        ExtOverload(
            "getMilliseconds", "timestamp_to_milliseconds_with_tz", True, (TIMESTAMP_TYPE, "string"), "int", _ms_zoned
        )
    )
    return tuple(out)


def _no_int_to_duration(value: int) -> Duration:
    """Declared by cel-go, but Int.ConvertToType has no Duration case: it always fails."""
    raise TimeError(f"type conversion error from 'int' to '{DURATION_TYPE}'")


_TS, _DUR = TIMESTAMP_TYPE, DURATION_TYPE

TIME_OVERLOADS: Final[tuple[ExtOverload, ...]] = (
    # conversions
    ExtOverload("timestamp", "string_to_timestamp", False, ("string",), _TS, parse_timestamp),
    ExtOverload("timestamp", "int64_to_timestamp", False, ("int",), _TS, timestamp_from_int),
    ExtOverload("timestamp", "timestamp_to_timestamp", False, (_TS,), _TS, lambda ts: ts),
    ExtOverload("duration", "string_to_duration", False, ("string",), _DUR, parse_duration),
    ExtOverload("duration", "int64_to_duration", False, ("int",), _DUR, _no_int_to_duration),
    ExtOverload("duration", "duration_to_duration", False, (_DUR,), _DUR, lambda d: d),
    ExtOverload("string", "timestamp_to_string", False, (_TS,), "string", str),
    ExtOverload("string", "duration_to_string", False, (_DUR,), "string", str),
    ExtOverload("int", "timestamp_to_int64", False, (_TS,), "int", lambda ts: ts.seconds),
    ExtOverload("int", "duration_to_int64", False, (_DUR,), "int", lambda d: d.nanos),
    # arithmetic
    ExtOverload("_+_", "add_timestamp_duration", False, (_TS, _DUR), _TS, Timestamp.add),
    ExtOverload("_+_", "add_duration_timestamp", False, (_DUR, _TS), _TS, lambda d, ts: ts.add(d)),
    ExtOverload("_+_", "add_duration_duration", False, (_DUR, _DUR), _DUR, Duration.add),
    ExtOverload("_-_", "subtract_timestamp_timestamp", False, (_TS, _TS), _DUR, Timestamp.sub),
    ExtOverload("_-_", "subtract_timestamp_duration", False, (_TS, _DUR), _TS, Timestamp.sub_duration),
    ExtOverload("_-_", "subtract_duration_duration", False, (_DUR, _DUR), _DUR, Duration.sub),
    # ordering
    *(
        ExtOverload(op, f"{stem}_{kind}", False, (cel_type, cel_type), "bool", test)
        for op, stem, test in (
            ("_<_", "less", lambda a, b: a.compare(b) < 0),
            ("_<=_", "less_equals", lambda a, b: a.compare(b) <= 0),
            ("_>_", "greater", lambda a, b: a.compare(b) > 0),
            ("_>=_", "greater_equals", lambda a, b: a.compare(b) >= 0),
        )
        for kind, cel_type in (("timestamp", _TS), ("duration", _DUR))
    ),
    # accessors
    *_timestamp_getters(),
    ExtOverload("getHours", "duration_to_hours", True, (_DUR,), "int", Duration.hours),
    ExtOverload("getMinutes", "duration_to_minutes", True, (_DUR,), "int", Duration.minutes),
    ExtOverload("getSeconds", "duration_to_seconds", True, (_DUR,), "int", Duration.seconds),
    ExtOverload("getMilliseconds", "duration_to_milliseconds", True, (_DUR,), "int", Duration.milliseconds),
)
