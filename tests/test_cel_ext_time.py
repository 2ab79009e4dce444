"""cel-go's timestamp and duration values (dra_driver/cel/ext/timeutil.py): Go's RFC 3339 and duration parsing,
cel-go's range and overflow rules, calendar accessors in time zones; verified against Kubernetes' own CEL
(tools/celeval) by test_time_cases_agree_with_kubernetes."""

from __future__ import annotations

import pytest

from dra_driver.cel.ext import OVERLOADS, Duration, ExtError, Timestamp, parse_duration, parse_timestamp
from tests.test_cel_ext_support import Err, ExtCase, celeval_binary, check_kubernetes, check_ours, equals, g, m, table

TS_ERR = Err("type conversion error from 'string' to 'google.protobuf.Timestamp'")
DUR_ERR = Err("type conversion error from 'string' to 'google.protobuf.Duration'")
OVERFLOW = Err("timestamp overflow")
INT_OVERFLOW = Err("integer overflow")
_GETTERS = ("getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getHours",
            "getMinutes", "getSeconds", "getMilliseconds")  # fmt: skip


def _fields_cel(tz: bool) -> str:
    arg = "$y" if tz else ""
    return "[" + ", ".join(f"timestamp($x).{name}({arg})" for name in _GETTERS) + "]"


def _fields_py(text: str, *tz: str) -> list[object]:
    ts = g("timestamp", text)
    return [m(name, ts, *tz) for name in _GETTERS]


CASES: list[ExtCase] = [
    *table(
        "string(timestamp($x))",
        lambda s: g("string", g("timestamp", s)),
        [
            ("2023-07-14T10:30:45Z", "2023-07-14T10:30:45Z"),
            ("2023-07-14T10:30:45.123000Z", "2023-07-14T10:30:45.123Z"),
            ("2023-07-14T10:30:45.1234567891Z", "2023-07-14T10:30:45.123456789Z"),
            ("2023-07-14T10:30:45,5Z", "2023-07-14T10:30:45.5Z"),
            ("2023-07-14T10:30:45+05:30", "2023-07-14T10:30:45+05:30"),
            ("2023-07-14T10:30:45-00:00", "2023-07-14T10:30:45Z"),
            ("2023-07-14T10:30:45+00:00", "2023-07-14T10:30:45Z"),
            ("2023-07-14T1:30:45Z", "2023-07-14T01:30:45Z"),
            ("2023-07-14T1:30:45,25+24:60", "2023-07-14T01:30:45.25+25:00"),
            ("2023-07-14T10:30:45.000000000Z", "2023-07-14T10:30:45Z"),
            ("2023-07-14T10:30:45+24:00", "2023-07-14T10:30:45+24:00"),
            ("2024-02-29T00:00:00Z", "2024-02-29T00:00:00Z"),
            ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z"),
            ("9999-12-31T23:59:59.999999999Z", "9999-12-31T23:59:59.999999999Z"),
            ("0001-01-01T00:30:00+01:00", OVERFLOW),
            ("9999-12-31T23:59:59-01:00", OVERFLOW),
            ("0000-12-31T23:00:00-01:00", "0000-12-31T23:00:00-01:00"),
            ("2023-02-29T00:00:00Z", TS_ERR),
            ("2023-13-01T00:00:00Z", TS_ERR),
            ("2023-07-14T24:00:00Z", TS_ERR),
            ("2023-07-14T10:60:00Z", TS_ERR),
            ("2023-07-14T10:30:60Z", TS_ERR),
            ("2023-07-14 10:30:45Z", TS_ERR),
            ("2023-07-14t10:30:45Z", TS_ERR),
            ("2023-07-14T10:30:45z", TS_ERR),
            ("2023-07-14T10:30:45", TS_ERR),
            ("2023-07-14T10:30:45.Z", TS_ERR),
            ("2023-07-14T10:30:45+0530", TS_ERR),
            ("2023-07-14T10:30:45+25:00", TS_ERR),
            ("2023-7-14T10:30:45Z", TS_ERR),
            ("2023-07-14", TS_ERR),
            ("+2023-07-14T10:30:45Z", TS_ERR),
            ("", TS_ERR),
        ],
    ),
    *table(
        "string(timestamp(int($x)))",
        lambda s: g("string", g("timestamp", int(s))),
        [
            ("0", "1970-01-01T00:00:00Z"),
            ("1689330645", "2023-07-14T10:30:45Z"),
            ("-62135596800", "0001-01-01T00:00:00Z"),
            ("-62135596801", OVERFLOW),
            ("253402300799", "9999-12-31T23:59:59Z"),
            ("253402300800", OVERFLOW),
        ],
    ),
    *table(
        "int(timestamp($x))",
        lambda s: g("int", g("timestamp", s)),
        [("1970-01-01T00:00:01.9Z", 1), ("1969-12-31T23:59:59.5Z", -1), ("2023-07-14T10:30:45+05:30", 1689310845)],
    ),
    *table(
        _fields_cel(False),
        _fields_py,
        [
            ("2023-07-14T10:30:45.123Z", [2023, 6, 14, 13, 5, 194, 10, 30, 45, 123]),
            ("2023-07-14T01:30:45.999+05:30", [2023, 6, 13, 12, 4, 193, 20, 0, 45, 999]),
            ("2024-12-31T23:59:59Z", [2024, 11, 31, 30, 2, 365, 23, 59, 59, 0]),
            ("0001-01-01T00:00:00Z", [1, 0, 1, 0, 1, 0, 0, 0, 0, 0]),
            ("1969-12-31T23:59:59.001Z", [1969, 11, 31, 30, 3, 364, 23, 59, 59, 1]),
        ],
    ),
    *table(
        _fields_cel(True),
        _fields_py,
        [
            (("2023-01-01T05:30:00Z", "-08:00"), [2022, 11, 31, 30, 6, 364, 21, 30, 0, 0]),
            (("2023-01-01T05:30:00Z", "+05:30"), [2023, 0, 1, 0, 0, 0, 11, 0, 0, 0]),
            (("2023-01-01T05:30:00Z", "-08:30"), [2022, 11, 31, 30, 6, 364, 21, 0, 0, 0]),
            (("2023-01-01T05:30:00Z", "-0:30"), [2023, 0, 1, 0, 0, 0, 5, 0, 0, 0]),
            (("2023-01-01T05:30:00Z", "100:00"), [2023, 0, 5, 4, 4, 4, 9, 30, 0, 0]),
            (("2023-07-01T05:00:00Z", "America/Los_Angeles"), [2023, 5, 30, 29, 5, 180, 22, 0, 0, 0]),
            (("2023-01-01T05:00:00Z", "America/Los_Angeles"), [2022, 11, 31, 30, 6, 364, 21, 0, 0, 0]),
            (("2023-07-14T10:30:45.123Z", "Asia/Kolkata"), [2023, 6, 14, 13, 5, 194, 16, 0, 45, 123]),
            (("2023-03-12T10:30:00Z", "America/New_York"), [2023, 2, 12, 11, 0, 70, 6, 30, 0, 0]),
            (("2023-11-05T05:30:00Z", "America/New_York"), [2023, 10, 5, 4, 0, 308, 1, 30, 0, 0]),
            (("2023-11-05T06:30:00Z", "America/New_York"), [2023, 10, 5, 4, 0, 308, 1, 30, 0, 0]),
            (("2023-07-14T10:30:45Z", "05:30"), [2023, 6, 14, 13, 5, 194, 16, 0, 45, 0]),
            (("2023-07-14T10:30:45Z", "Local"), [2023, 6, 14, 13, 5, 194, 10, 30, 45, 0]),
            (("2023-07-14T10:30:45Z", "Etc/GMT+5"), [2023, 6, 14, 13, 5, 194, 5, 30, 45, 0]),
            (("2023-07-14T10:30:45Z", "utc"), Err("unknown time zone utc")),
            (("2023-07-14T10:30:45Z", "America"), Err("is a directory")),
            (("2023-07-14T10:30:45Z", "zone.tab"), Err("malformed time zone information")),
            (("2023-07-14T10:30:45Z", "right/UTC"), [2023, 6, 14, 13, 5, 194, 10, 30, 45, 0]),
            (("2023-07-14T10:30:45Z", "UTC"), [2023, 6, 14, 13, 5, 194, 10, 30, 45, 0]),
            (("2023-07-14T10:30:45Z", ""), [2023, 6, 14, 13, 5, 194, 10, 30, 45, 0]),
            (("0001-01-01T00:00:00Z", "-01:00"), [0, 11, 31, 30, 0, 365, 23, 0, 0, 0]),
            (("2023-07-14T10:30:45Z", "Mars/Olympus"), Err("unknown time zone Mars/Olympus")),
            (("2023-07-14T10:30:45Z", "../etc/passwd"), Err("time: invalid location name")),
            (("2023-07-14T10:30:45Z", "x:00"), Err('strconv.Atoi: parsing "x": invalid syntax')),
            (("2023-07-14T10:30:45Z", "+05:"), Err('strconv.Atoi: parsing "": invalid syntax')),
        ],
    ),
    *table(
        "string(duration($x))",
        lambda s: g("string", g("duration", s)),
        [
            ("0", "0s"),
            ("-0", "0s"),
            ("1h30m", "5400s"),
            ("1.5h", "5400s"),
            ("-2us", "-0.000002s"),
            ("3µs", "0.000003s"),
            ("3μs", "0.000003s"),
            ("1ns", "0.000000001s"),
            ("+.5s", "0.5s"),
            ("5.s", "5s"),
            ("1h1h", "7200s"),
            ("0.1s", "0.1s"),
            ("0.3333333333333333333333s", "0.333333333s"),
            ("2562047h47m16.854775807s", "9223372036.854776s"),
            ("-2562047h47m16.854775808s", "-9223372036.854776s"),
            ("2562047h47m16.854775808s", DUR_ERR),
            ("9223372036854775808ns", DUR_ERR),
            ("1", DUR_ERR),
            ("1d", DUR_ERR),
            ("1H", DUR_ERR),
            (".s", DUR_ERR),
            ("", DUR_ERR),
            ("-", DUR_ERR),
            ("1h 30m", DUR_ERR),
            ("1e3s", DUR_ERR),
            ("0.1h", "360s"),
            ("1.0000000000000000000001h", "3600s"),
            ("1.5µs", "0.0000015s"),
            ("100000000000000000000ns", DUR_ERR),
            ("1.1.1s", DUR_ERR),
            ("1s-1s", DUR_ERR),
            ("1s.5s", "1.5s"),
        ],
    ),
    *table(
        "[duration($x).getHours(), duration($x).getMinutes(), duration($x).getSeconds(), "
        "duration($x).getMilliseconds(), int(duration($x))]",
        lambda s: (
            [m(name, g("duration", s)) for name in ("getHours", "getMinutes", "getSeconds", "getMilliseconds")]
            + [g("int", g("duration", s))]
        ),
        [
            ("3723.456s", [1, 62, 3723, 3723456, 3723456000000]),
            ("-3723.456s", [-1, -62, -3723, -3723456, -3723456000000]),
            ("-1ns", [0, 0, 0, 0, -1]),
            ("2562047h47m16.854775807s", [2562047, 153722867, 9223372036, 9223372036854, 9223372036854775807]),
        ],
    ),
    *table(
        "[duration($x) < duration($y), duration($x) <= duration($y), duration($x) > duration($y), "
        "duration($x) >= duration($y), duration($x) == duration($y)]",
        lambda a, b: (
            [g(op, g("duration", a), g("duration", b)) for op in ("_<_", "_<=_", "_>_", "_>=_")]
            + [g("duration", a) == g("duration", b)]
        ),
        [
            (("1h", "30m"), [False, False, True, True, False]),
            (("60m", "1h"), [False, True, False, True, True]),
            (("-1ns", "0"), [True, True, False, False, False]),
        ],
    ),
    *table(
        "[timestamp($x) < timestamp($y), timestamp($x) <= timestamp($y), timestamp($x) > timestamp($y), "
        "timestamp($x) >= timestamp($y), timestamp($x) == timestamp($y)]",
        lambda a, b: (
            [g(op, g("timestamp", a), g("timestamp", b)) for op in ("_<_", "_<=_", "_>_", "_>=_")]
            + [g("timestamp", a) == g("timestamp", b)]
        ),
        [
            (("2023-01-01T00:00:00Z", "2023-01-01T05:30:00+05:30"), [False, True, False, True, True]),
            (("2023-01-01T00:00:00Z", "2023-01-01T00:00:00.000000001Z"), [True, True, False, False, False]),
        ],
    ),
    *table(
        "string(timestamp($x) + duration($y))",
        lambda a, b: g("string", g("_+_", g("timestamp", a), g("duration", b))),
        [
            (("2023-01-01T00:00:00Z", "24h1m2s"), "2023-01-02T00:01:02Z"),
            (("2023-01-01T00:00:00+05:30", "1h"), "2023-01-01T01:00:00+05:30"),
            (("2023-01-01T00:00:00.5Z", "-0.75s"), "2022-12-31T23:59:59.75Z"),
            (("9999-12-31T23:59:59Z", "1s"), OVERFLOW),
            (("0001-01-01T00:00:00Z", "-1ns"), OVERFLOW),
        ],
    ),
    *table(
        "string(duration($y) + timestamp($x))",
        lambda a, b: g("string", g("_+_", g("duration", b), g("timestamp", a))),
        [(("2023-01-01T00:00:00Z", "-1h"), "2022-12-31T23:00:00Z")],
    ),
    *table(
        "string(timestamp($x) - duration($y))",
        lambda a, b: g("string", g("_-_", g("timestamp", a), g("duration", b))),
        [
            (("2023-01-10T12:00:00Z", "12h"), "2023-01-10T00:00:00Z"),
            (("2023-01-10T12:00:00Z", "-2562047h47m16.854775808s"), INT_OVERFLOW),
        ],
    ),
    *table(
        "string(timestamp($x) - timestamp($y))",
        lambda a, b: g("string", g("_-_", g("timestamp", a), g("timestamp", b))),
        [
            (("2023-01-10T12:00:00Z", "2023-01-10T00:00:00Z"), "43200s"),
            (("2023-01-10T00:00:00Z", "2023-01-10T00:00:00.25Z"), "-0.25s"),
            (("9999-01-01T00:00:00Z", "0001-01-01T00:00:00Z"), INT_OVERFLOW),
        ],
    ),
    *table(
        "string(duration($x) + duration($y))",
        lambda a, b: g("string", g("_+_", g("duration", a), g("duration", b))),
        [(("1m", "1s"), "61s"), (("2562047h", "1h"), INT_OVERFLOW)],
    ),
    *table(
        "string(duration($x) - duration($y))",
        lambda a, b: g("string", g("_-_", g("duration", a), g("duration", b))),
        [(("1m", "1s"), "59s"), (("-2562047h", "1h"), INT_OVERFLOW)],
    ),
    *table(
        "dyn(timestamp($x)) == dyn($y)",
        lambda a, b: equals(g("timestamp", a), b),
        [(("1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z"), False)],
    ),
    *table("dyn(duration($x)) == dyn($y)", lambda a, b: equals(g("duration", a), b), [(("0", "0"), False)]),
]


def test_time_cases_match_the_table() -> None:
    assert check_ours(CASES) == []


def test_time_cases_agree_with_kubernetes() -> None:
    assert check_kubernetes(celeval_binary(), CASES) == []


def test_values_compare_by_instant_and_sort() -> None:
    early, late = parse_timestamp("2023-01-01T05:30:00+05:30"), parse_timestamp("2023-01-01T00:00:01Z")
    assert early == parse_timestamp("2023-01-01T00:00:00Z") and hash(early) == hash(Timestamp(1672531200))
    assert sorted([late, early]) == [early, late]
    assert sorted([parse_duration("1h"), parse_duration("-1s")]) == [Duration(-(10**9)), Duration(3600 * 10**9)]
    assert repr(parse_duration("90m")) == "duration('5400s')"
    with pytest.raises(ExtError, match=r"^integer overflow$"):
        Duration(2**63)


@pytest.mark.parametrize(
    ("function", "member", "params", "result"),
    [
        ("timestamp", False, ("string",), "google.protobuf.Timestamp"),
        ("duration", False, ("int",), "google.protobuf.Duration"),
        ("_-_", False, ("google.protobuf.Timestamp", "google.protobuf.Timestamp"), "google.protobuf.Duration"),
        ("_<_", False, ("google.protobuf.Duration", "google.protobuf.Duration"), "bool"),
        ("getDayOfWeek", True, ("google.protobuf.Timestamp", "string"), "int"),
        ("getMilliseconds", True, ("google.protobuf.Duration",), "int"),
    ],
)
def test_table_declares_cel_go_signatures(function: str, member: bool, params: tuple[str, ...], result: str) -> None:
    found = [o for o in OVERLOADS if (o.function, o.member, o.params) == (function, member, params)]
    assert [o.result for o in found] == [result]
    # no negation or duration arithmetic beyond cel-go's declarations
    assert not [o for o in OVERLOADS if o.function == "-_"]
