"""tests/cluster/runc_caps.py: the runc wrapper of the tests' Docker daemon drops from a container's spec (runc
create/run: the bundle's config.json) or an exec's process (runc exec --process) exactly the capabilities outside its
own bounding set, leaves everything else as it was, and then execs the real runc with its own arguments."""

from __future__ import annotations

import builtins
import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import runc_caps

SCRIPT = Path(runc_caps.__file__)
ALL_CAPS = [f"CAP_{name}" for name in runc_caps.CAPS]
KINDS = ("bounding", "effective", "permitted", "inheritable", "ambient")


def _status(cap_bnd: str) -> str:
    """A /proc/<pid>/status text of a root process with bounding set `cap_bnd`."""
    return (
        "Name:\tdockerd\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nPid:\t4242\nPPid:\t1\n"
        "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n"
        f"CapInh:\t0000000000000000\nCapPrm:\t{cap_bnd}\nCapEff:\t{cap_bnd}\nCapBnd:\t{cap_bnd}\n"
        "CapAmb:\t0000000000000000\nNoNewPrivs:\t0\nSeccomp:\t0\nSpeculation_Store_Bypass:\tthread vulnerable\n"
    )


def _bundle_spec() -> dict[str, Any]:
    """What `docker run --privileged` hands runc, trimmed: every capability in every set but ambient."""
    caps = {kind: list(ALL_CAPS) for kind in KINDS if kind != "ambient"}
    return {
        "ociVersion": "1.2.0",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/sbin/init"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container=docker"],
            "cwd": "/",
            "capabilities": caps,
            "oomScoreAdj": 0,
        },
        "root": {"path": "/var/lib/docker/overlay2/abc/merged"},
        "hostname": "dra-worker",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]}],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}], "maskedPaths": [], "readonlyPaths": []},
        "annotations": {"org.opencontainers.image.stopSignal": "37", "ünïcode": "välue"},
    }


def _exec_process() -> dict[str, Any]:
    """An exec's process.json (`docker exec --privileged`): the capabilities at the top level."""
    return {
        "user": {"uid": 0, "gid": 0},
        "args": ["kubeadm", "join"],
        "env": ["HOME=/root"],
        "cwd": "/",
        "capabilities": {
            "bounding": list(ALL_CAPS),
            "effective": list(ALL_CAPS),
            "permitted": list(ALL_CAPS),
            "inheritable": ["CAP_CHOWN", "CAP_SYS_RESOURCE"],
            "ambient": ["CAP_SYS_RESOURCE", "CAP_NET_ADMIN"],
        },
        "apparmorProfile": "unconfined",
        "noNewPrivileges": False,
    }


def _without(caps: dict[str, list[str]], missing: set[str]) -> dict[str, list[str]]:
    return {kind: [c for c in names if c not in missing] for kind, names in caps.items()}


# missing_caps


def test_a_full_bounding_set_misses_nothing() -> None:
    assert runc_caps.missing_caps(_status("000001ffffffffff")) == set()  # the 41 capabilities of Linux 5.9+
    assert runc_caps.missing_caps(_status("ffffffffffffffff")) == set()  # bits beyond the known ones: no matter


def test_a_bounding_set_without_sys_resource() -> None:
    assert runc_caps.missing_caps(_status("000001fffeffffff")) == {"CAP_SYS_RESOURCE"}  # bit 24


def test_each_bit_is_its_own_capability() -> None:
    caps = runc_caps.CAPS
    assert (caps[0], caps[21], caps[24], caps[40]) == ("CHOWN", "SYS_ADMIN", "SYS_RESOURCE", "CHECKPOINT_RESTORE")
    assert runc_caps.missing_caps(_status("000001fffffffffe")) == {"CAP_CHOWN"}
    assert runc_caps.missing_caps(_status("000001ffffdfffff")) == {"CAP_SYS_ADMIN"}
    assert runc_caps.missing_caps(_status("000000ffffffffff")) == {"CAP_CHECKPOINT_RESTORE"}
    # an older kernel's bounding set (Linux 5.8 and earlier: 38 capabilities) misses the newer three
    assert runc_caps.missing_caps(_status("0000003fffffffff")) == {"CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"}
    assert runc_caps.missing_caps(_status("0000000000000000")) == set(ALL_CAPS)


def test_only_the_bounding_set_counts() -> None:
    status = _status("000001fffeffffff").replace("CapPrm:\t000001fffeffffff", "CapPrm:\t0000000000000000")
    status = status.replace("CapEff:\t000001fffeffffff", "CapEff:\t0000000000000000")
    assert runc_caps.missing_caps(status) == {"CAP_SYS_RESOURCE"}


# rewrite


def test_rewrite_of_a_bundle_drops_exactly_the_missing_caps(tmp_path: Path) -> None:
    spec = _bundle_spec()
    spec["process"]["capabilities"]["ambient"] = ["CAP_NET_RAW", "CAP_SYS_RESOURCE"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec, indent="\t", ensure_ascii=False))
    missing = {"CAP_SYS_RESOURCE", "CAP_BPF"}
    runc_caps.rewrite(str(path), missing, bundle=True)
    got = json.loads(path.read_text())
    expected = copy.deepcopy(spec)
    expected["process"]["capabilities"] = _without(spec["process"]["capabilities"], missing)
    assert got == expected
    assert list(got) == list(spec) and list(got["process"]) == list(spec["process"])  # key order kept too
    caps = got["process"]["capabilities"]
    assert set(caps) == set(KINDS)
    for kind in ("bounding", "effective", "permitted", "inheritable"):
        assert caps[kind] == [c for c in ALL_CAPS if c not in missing]  # the same order, less the missing ones
    assert caps["ambient"] == ["CAP_NET_RAW"]


def test_rewrite_of_an_exec_process_file(tmp_path: Path) -> None:
    process = _exec_process()
    path = tmp_path / "process.json"
    path.write_text(json.dumps(process))
    runc_caps.rewrite(str(path), {"CAP_SYS_RESOURCE"}, bundle=False)
    got = json.loads(path.read_text())
    expected = copy.deepcopy(process)
    expected["capabilities"] = _without(process["capabilities"], {"CAP_SYS_RESOURCE"})
    assert got == expected
    assert got["capabilities"]["inheritable"] == ["CAP_CHOWN"]
    assert got["capabilities"]["ambient"] == ["CAP_NET_ADMIN"]
    assert "CAP_SYS_RESOURCE" not in got["capabilities"]["bounding"]
    assert len(got["capabilities"]["bounding"]) == len(ALL_CAPS) - 1


def test_rewrite_of_a_bundle_leaves_top_level_capabilities_alone(tmp_path: Path) -> None:
    # bundle=True looks at process.capabilities only; bundle=False at the top level only
    spec = _bundle_spec()
    spec["capabilities"] = {"bounding": ["CAP_SYS_RESOURCE"]}  # no such field in a spec: not runc's, not ours
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec))
    runc_caps.rewrite(str(path), {"CAP_SYS_RESOURCE"}, bundle=True)
    got = json.loads(path.read_text())
    assert got["capabilities"] == {"bounding": ["CAP_SYS_RESOURCE"]}
    assert "CAP_SYS_RESOURCE" not in got["process"]["capabilities"]["effective"]

    process = _exec_process()
    process["process"] = {"capabilities": {"bounding": ["CAP_SYS_RESOURCE"]}}
    path = tmp_path / "process.json"
    path.write_text(json.dumps(process))
    runc_caps.rewrite(str(path), {"CAP_SYS_RESOURCE"}, bundle=False)
    got = json.loads(path.read_text())
    assert got["process"] == {"capabilities": {"bounding": ["CAP_SYS_RESOURCE"]}}
    assert "CAP_SYS_RESOURCE" not in got["capabilities"]["bounding"]


def test_rewrite_without_capabilities_changes_nothing(tmp_path: Path) -> None:
    spec = _bundle_spec()
    del spec["process"]["capabilities"]
    spec["process"]["capabilities"] = None
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec))
    runc_caps.rewrite(str(path), {"CAP_SYS_RESOURCE"}, bundle=True)
    assert json.loads(path.read_text()) == spec

    no_process = {"ociVersion": "1.2.0", "root": {"path": "rootfs"}}
    path.write_text(json.dumps(no_process))
    runc_caps.rewrite(str(path), {"CAP_SYS_RESOURCE"}, bundle=True)
    assert json.loads(path.read_text()) == no_process


def test_rewrite_with_nothing_missing_keeps_every_cap(tmp_path: Path) -> None:
    spec = _bundle_spec()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec))
    runc_caps.rewrite(str(path), set(), bundle=True)
    assert json.loads(path.read_text()) == spec


# option


@pytest.mark.parametrize(
    ("args", "names", "expected"),
    [
        (["create", "--bundle", "/b", "id"], ("--bundle", "-b"), "/b"),
        (["create", "--bundle=/b", "id"], ("--bundle", "-b"), "/b"),
        (["create", "-b", "/b", "id"], ("--bundle", "-b"), "/b"),
        (["create", "-b=/b", "id"], ("--bundle", "-b"), "/b"),
        (["--root", "/r", "--log", "/l", "run", "--bundle", "/b", "id"], ("--bundle", "-b"), "/b"),
        (["--bundle=/x=y", "id"], ("--bundle", "-b"), "/x=y"),  # the first = splits
        (["exec", "--process", "/p.json", "--detach", "id"], ("--process", "-p"), "/p.json"),
        (["exec", "--process=/p.json", "id"], ("--process", "-p"), "/p.json"),
        (["exec", "-p", "/p.json", "id"], ("--process", "-p"), "/p.json"),
        (["create", "id"], ("--bundle", "-b"), None),
        (["create", "id", "--bundle"], ("--bundle", "-b"), None),  # no value after it
        (["create", "--bundles", "/b", "id"], ("--bundle", "-b"), None),  # another option's name
        (["create", "--bundlex=/b", "id"], ("--bundle", "-b"), None),
        ([], ("--bundle", "-b"), None),
    ],
)
def test_option(args: list[str], names: tuple[str, ...], expected: str | None) -> None:
    assert runc_caps.option(args, *names) == expected


# main, in this process: /proc/self/status and os.execv are the test's


class _Exec(Exception):
    """os.execv does not return: neither does the fake."""


def _patch_main(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, status: str) -> list[tuple[str, list[str]]]:
    """main's /proc/self/status reads `status`; its os.execv is recorded (and raises: it does not return)."""
    real_open = builtins.open
    status_file = tmp_path / "proc-self-status"
    status_file.write_text(status)
    calls: list[tuple[str, list[str]]] = []

    def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        return real_open(status_file if str(file) == "/proc/self/status" else file, *args, **kwargs)

    def fake_execv(path: str, argv: list[str]) -> None:
        calls.append((path, list(argv)))
        raise _Exec

    monkeypatch.setattr(runc_caps, "open", fake_open, raising=False)  # the module's own `open`, not builtins'
    monkeypatch.setattr(os, "execv", fake_execv)  # runc_caps calls os.execv
    monkeypatch.setattr(runc_caps, "RUNC", "/opt/real/runc")
    return calls


def _main(args: list[str]) -> None:
    with pytest.raises(_Exec):
        runc_caps.main(args)


@pytest.mark.parametrize("form", [["--bundle", "{b}"], ["--bundle={b}"], ["-b", "{b}"]])
@pytest.mark.parametrize("command", ["create", "run"])
def test_main_rewrites_the_bundle_then_execs_runc(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str, form: list[str]
) -> None:
    calls = _patch_main(monkeypatch, tmp_path, _status("000001fffeffffff"))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = _bundle_spec()
    (bundle / "config.json").write_text(json.dumps(spec))
    args = ["--root", "/run/docker/runtime-runc/moby", "--log", str(tmp_path / "log.json"), command,
            *(a.format(b=bundle) for a in form), "--pid-file", str(tmp_path / "pid"), "c0ffee"]  # fmt: skip
    _main(args)
    assert calls == [("/opt/real/runc", ["runc", *args])]  # runc's own arguments, untouched
    got = json.loads((bundle / "config.json").read_text())
    expected = copy.deepcopy(spec)
    expected["process"]["capabilities"] = _without(spec["process"]["capabilities"], {"CAP_SYS_RESOURCE"})
    assert got == expected


def test_main_without_a_bundle_option_rewrites_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _patch_main(monkeypatch, tmp_path, _status("000001fffeffffff"))
    spec = _bundle_spec()
    (tmp_path / "config.json").write_text(json.dumps(spec))
    monkeypatch.chdir(tmp_path)  # runc's default bundle: the current directory
    _main(["create", "c0ffee"])
    assert calls == [("/opt/real/runc", ["runc", "create", "c0ffee"])]
    got = json.loads((tmp_path / "config.json").read_text())
    assert "CAP_SYS_RESOURCE" not in got["process"]["capabilities"]["bounding"]
    assert len(got["process"]["capabilities"]["bounding"]) == len(ALL_CAPS) - 1


@pytest.mark.parametrize("form", [["--process", "{p}"], ["--process={p}"], ["-p", "{p}"]])
def test_main_rewrites_an_exec_process_then_execs_runc(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, form: list[str]
) -> None:
    calls = _patch_main(monkeypatch, tmp_path, _status("000001fffeffffff"))
    process = _exec_process()
    path = tmp_path / "process.json"
    path.write_text(json.dumps(process))
    bundle_spec = _bundle_spec()
    (tmp_path / "config.json").write_text(json.dumps(bundle_spec))  # an exec leaves the container's spec alone
    monkeypatch.chdir(tmp_path)
    args = ["--root", "/r", "exec", *(a.format(p=path) for a in form), "--detach", "c0ffee"]
    _main(args)
    assert calls == [("/opt/real/runc", ["runc", *args])]
    expected = copy.deepcopy(process)
    expected["capabilities"] = _without(process["capabilities"], {"CAP_SYS_RESOURCE"})
    assert json.loads(path.read_text()) == expected
    assert json.loads((tmp_path / "config.json").read_text()) == bundle_spec


def test_main_with_every_cap_touches_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _patch_main(monkeypatch, tmp_path, _status("000001ffffffffff"))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    text = json.dumps(_bundle_spec(), indent=2)  # not json.dump's own layout: a rewrite would show
    (bundle / "config.json").write_text(text)
    process = tmp_path / "process.json"
    process.write_text(json.dumps(_exec_process(), indent=2))
    before = process.read_text()
    _main(["create", "--bundle", str(bundle), "c0ffee"])
    _main(["exec", "--process", str(process), "c0ffee"])
    assert (bundle / "config.json").read_text() == text and process.read_text() == before
    assert [argv for _, argv in calls] == [
        ["runc", "create", "--bundle", str(bundle), "c0ffee"],
        ["runc", "exec", "--process", str(process), "c0ffee"],
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["start", "c0ffee"],
        ["delete", "--force", "c0ffee"],
        ["state", "c0ffee"],
        ["kill", "c0ffee", "9"],
        ["exec", "c0ffee", "true"],  # an exec without a process file: its command line, nothing to rewrite
    ],
)
def test_main_leaves_other_commands_to_runc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]) -> None:
    calls = _patch_main(monkeypatch, tmp_path, _status("000001fffeffffff"))
    text = json.dumps(_bundle_spec(), indent=2)
    (tmp_path / "config.json").write_text(text)
    monkeypatch.chdir(tmp_path)
    _main(["--root", "/r", *args])
    assert calls == [("/opt/real/runc", ["runc", "--root", "/r", *args])]
    assert (tmp_path / "config.json").read_text() == text


# the script itself, as dockerd runs it: a subprocess whose bounding set is this one's, and a fake runc


def _fake_runc(tmp_path: Path) -> tuple[Path, Path]:
    record = tmp_path / "record"
    record.mkdir()
    runc = tmp_path / "runc"
    runc.write_text(
        "#!/bin/sh\n"
        f'record="{record}"\n'
        'printf "%s\\n" "$@" > "$record/argv"\n'
        'bundle=.\nprev=""\n'
        'for a in "$@"; do\n'
        '  case "$prev" in --bundle|-b) bundle="$a";; esac\n'
        '  case "$a" in --bundle=*) bundle="${a#--bundle=}";; esac\n'
        '  prev="$a"\n'
        "done\n"
        'cp "$bundle/config.json" "$record/config.json"\n'
        "exit 7\n"
    )
    runc.chmod(runc.stat().st_mode | stat.S_IXUSR)
    return runc, record


def test_the_script_execs_runc_with_the_spec_rewritten(tmp_path: Path) -> None:
    with open("/proc/self/status") as f:
        missing = runc_caps.missing_caps(f.read())  # a child's bounding set is its parent's
    runc, record = _fake_runc(tmp_path)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = _bundle_spec()
    (bundle / "config.json").write_text(json.dumps(spec))
    args = ["--root", str(tmp_path / "root"), "--log", str(tmp_path / "log"), "create", "--bundle", str(bundle), "id"]
    env = {**os.environ, "DRA_RUNC": str(runc)}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr  # runc's exit status: the wrapper exec'd it, it did not run it
    assert (record / "argv").read_text().splitlines() == args
    seen = json.loads((record / "config.json").read_text())
    expected = copy.deepcopy(spec)
    expected["process"]["capabilities"] = _without(spec["process"]["capabilities"], missing)
    assert seen == expected
    if missing:  # on these machines root lacks CAP_SYS_RESOURCE; elsewhere the spec passes as it was
        assert not set(seen["process"]["capabilities"]["bounding"]) & missing
