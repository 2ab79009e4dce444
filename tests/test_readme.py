"""The README and docs/ stay true: the README is short, and every path, link and command in it exists."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from dra_driver.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".sh", ".toml", ".proto", ".txt")
SHELL_BLOCK = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
BACKTICKED = re.compile(r"`([^`\n]+)`")
TOP_LEVEL = {p.name for p in ROOT.iterdir()}


def _path_candidate(token: str, rooted_only: bool) -> bool:
    """Whether a backticked token names a repository path (not a URL, an API group, a host path or a template)."""
    if re.search(r"[\s<>*${}:=]", token) or token.startswith(("/", "~", "-", ".venv", "http")):
        return False
    if token.startswith(".") and "/" not in token:  # a suffix (`.proto`), not a file
        return False
    if "/" in token and token.split("/", 1)[0] in TOP_LEVEL:
        return True
    return not rooted_only and (token.endswith("/") or token.endswith(FILE_SUFFIXES))


def _exists(token: str, bases: list[Path]) -> bool:
    return any((base / token).exists() for base in [ROOT, *bases])


def _missing_paths(text: str, rooted_only: bool) -> list[str]:
    """Backticked paths that do not exist. A bare name in a table row (`api.py` beside `dra_driver/nvml/`) may be
    relative to a directory another path of that row names, or to its parent (`telemetry/` beside
    `dra_driver/health/`)."""
    missing = []
    for line in text.splitlines():
        tokens = [t for t in BACKTICKED.findall(line) if _path_candidate(t, rooted_only)]
        bases: list[Path] = []
        if line.startswith("|"):
            for t in tokens:
                path = ROOT / t
                if path.exists():
                    base = path if path.is_dir() else path.parent
                    bases += [base, base.parent]
        missing += [t for t in tokens if not _exists(t, bases)]
    return missing


def _commands(block: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split at && ; |."""
    commands: list[list[str]] = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token in ("&&", "||", ";", "|", "&"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [c for c in commands if c]


def _command_problem(argv: list[str]) -> str | None:
    """Why a command refers to something that does not exist, or None."""
    while argv and (argv[0] == "sudo" or re.fullmatch(r"[A-Z_]+=\S*", argv[0])):
        argv = argv[1:]
    program, args = Path(argv[0]).name, argv[1:]
    for arg in args:
        if _path_candidate(arg, rooted_only=True) and not _exists(arg, []):
            return f"{arg} does not exist"
    if program in ("python", "python3"):
        if args[:1] == ["-m"]:
            module = args[1]
            if module.split(".")[0] in TOP_LEVEL:
                path = ROOT / module.replace(".", "/")
                return None if path.with_suffix(".py").is_file() or path.is_dir() else f"no module {module}"
            return None if importlib.util.find_spec(module) else f"no module {module}"
        return None if (ROOT / args[0]).is_file() else f"no script {args[0]}"
    if program in ("bash", "sh"):
        return None if (ROOT / args[0]).is_file() else f"no script {args[0]}"
    if program == "dra-driver":
        try:
            build_parser().parse_args(args)
        except SystemExit:
            return f"dra-driver does not take {' '.join(args)}"
        return None
    if program == "pip":
        return None
    return f"no check for {program}: teach tests/test_readme.py what it is"


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) < MAX_README_LINES


def test_every_path_in_the_readme_exists() -> None:
    assert _missing_paths(README.read_text(), rooted_only=False) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_repository_path_in_docs_exists(doc: Path) -> None:
    assert _missing_paths(doc.read_text(), rooted_only=True) == []


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_every_local_link_resolves(doc: Path) -> None:
    targets = [t.split("#", 1)[0] for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+:", t)]
    assert [t for t in targets if t and not (doc.parent / t).exists()] == []


def test_the_readme_links_every_page_of_docs() -> None:
    linked = {(ROOT / t).resolve() for t in LINK.findall(README.read_text())}
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


def test_every_command_of_the_readme_exists() -> None:
    commands = [c for block in SHELL_BLOCK.findall(README.read_text()) for c in _commands(block)]
    assert len(commands) >= 4  # the two commands: venv, pip, demo; .ci/run
    assert [(c, p) for c in commands if (p := _command_problem(c))] == []


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("python3 -m venv .venv", None),
        ("python3 -m tests.cluster up", None),
        ("python -m tests.no_such_module", "no module tests.no_such_module"),
        ("bash .ci/run", None),
        ("bash .ci/no-such-script", ".ci/no-such-script does not exist"),
        (".venv/bin/dra-driver demo --sim dgx-h100", None),
        (".venv/bin/dra-driver no-such-command", "dra-driver does not take no-such-command"),
        ("python bench/bench_cel.py", None),
        ("python bench/no_such_bench.py", "bench/no_such_bench.py does not exist"),
        ("frobnicate", "no check for frobnicate: teach tests/test_readme.py what it is"),
    ],
)
def test_commands_are_checked(command: str, problem: str | None) -> None:
    assert [_command_problem(c) for c in _commands(command)] == [problem]


def test_paths_are_checked() -> None:
    table = "| `dra_driver/nvml/` | `api.py`, `no_such.py` |\n"
    table += "| `dra_driver/health/`, `telemetry/` | `resource.k8s.io/v1`, `.proto` files |"
    assert _missing_paths(table, rooted_only=False) == ["no_such.py"]
    assert _missing_paths("`dra_driver/no_such/` `<plugin dir>/dra.sock` `/dev/nvidia0`", rooted_only=True) == [
        "dra_driver/no_such/"
    ]
