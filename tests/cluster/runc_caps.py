#!/usr/bin/env python3
"""runc for the tests' Docker daemon (tests/cluster/docker.py): the same runc, asked only for the capabilities the
daemon itself holds.

`docker run --privileged` (kind's nodes) asks for every capability the kernel knows. runc cannot grant one outside
its own bounding set and then refuses to start the container at all ("unable to apply caps: operation not
permitted"); on these machines root lacks CAP_SYS_RESOURCE. So before `runc create`/`run` (the bundle's config.json)
and `runc exec` (its --process file), capabilities outside this process's bounding set are dropped from the request,
and everything else is runc's. A container then runs with what a privileged one could get here, and no more.
"""

import json
import os
import sys

_CAP_NAMES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
    "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN "
    "SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE "
    "MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
)  # in bit order (linux/capability.h)
CAPS = tuple(_CAP_NAMES.split())
RUNC = os.environ.get("DRA_RUNC", "/usr/sbin/runc")


def missing_caps(status: str) -> set[str]:
    """The capabilities (CAP_ names) outside the bounding set of a /proc/<pid>/status text."""
    bounding = int(status.split("CapBnd:")[1].split()[0], 16)
    return {f"CAP_{name}" for bit, name in enumerate(CAPS) if not bounding >> bit & 1}


def drop(process: dict[str, object], missing: set[str]) -> None:
    caps = process.get("capabilities")
    if isinstance(caps, dict):
        for kind, names in caps.items():
            if isinstance(names, list):
                caps[kind] = [n for n in names if n not in missing]


def rewrite(path: str, missing: set[str], *, bundle: bool) -> None:
    with open(path) as f:
        spec = json.load(f)
    process = spec.get("process") if bundle else spec
    if isinstance(process, dict):
        drop(process, missing)
    with open(path, "w") as f:
        json.dump(spec, f)


def option(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def main(args: list[str]) -> None:
    with open("/proc/self/status") as f:
        missing = missing_caps(f.read())
    command = next((a for a in args if a in ("create", "run", "exec")), None)
    if missing and command in ("create", "run"):
        rewrite(os.path.join(option(args, "--bundle", "-b") or ".", "config.json"), missing, bundle=True)
    elif missing and command == "exec":
        process = option(args, "--process", "-p")
        if process:
            rewrite(process, missing, bundle=False)
    os.execv(RUNC, ["runc", *args])


if __name__ == "__main__":
    main(sys.argv[1:])
