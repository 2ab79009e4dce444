"""What the driver and the kubelet logged while the driver ran on the test node, for tests that require a clean log.

The kubelet deletes a pod's log directory with the pod (a driver pod replaced in a rolling update, restarted or
uninstalled), so `DriverLogs` hard-links each container log file of the release's namespace into a directory of its
own as soon as it appears: the link keeps the file, and everything the container writes to it later, after the
kubelet has unlinked its name. Pods already there at the start are a previous release's, still terminating: not
kept. The kubelet's own log is one file for the node's life: the lines after the offset at the start are this
release's.

A problem is a line of the plugin container at level WARNING or above or that is not one of its JSON lines (a bare
traceback, a library writing to stderr); a line of another container of the release (an MPS control daemon, which
logs as NVIDIA's does) at WARNING or above or that says error; or a kubelet line at level W or E that names the
driver or its health stream. A line that a fault test causes on purpose is expected by a regex (`expect`), named in
that test; `KUBELET_ROUTINE` are the kubelet's lines that every stop of a driver pod causes.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

# Fields of a line the container runtime writes (CRI log format): time, stream, P(artial)/F(ull), the text.
_CRI_LINE = re.compile(r"^\S+ (stdout|stderr) [PF] (.*)$")
_KLOG_PROBLEM = re.compile(r"^[WE]\d{4} ")
_PROBLEM_LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL"})
# The kubelet cancelling its own health stream (its shutdown, or a new registration of the plugin):
# kubelet/cm/dra/manager.go means to treat that as a normal end (`errors.Is(err, context.Canceled)`), but the gRPC
# status error does not wrap context.Canceled, so it logs it at level E. "context canceled" is grpc-go's description
# of the client's own context: a stream our server ended reads otherwise (Unavailable, or our status message).
KUBELET_OWN_CANCEL = re.compile(
    r'Error receiving from WatchResources stream.*err="rpc error: code = Canceled desc = context canceled"'
)
KUBELET_ROUTINE = (
    KUBELET_OWN_CANCEL,
    # grpc-go's channel (level W) trying the socket of a plugin that stops or stopped, until the kubelet's plugin
    # watcher sees its registration socket go and drops the connection
    re.compile(
        r"grpc: addrConn\.createTransport failed to connect to .*: (connection refused|no such file or dir"
        r"|connection reset by peer"
        r"|failed to write client preface: .*broken pipe)"
    ),
    # the liveness or readiness probe's exec cancelled by the kubelet itself because the container is stopping, or
    # (kubelet 1.37) started as the container stopped (its shim's connection closing), after it exited, or after
    # containerd removed its task (or while it removed it: "deleted state"), or runc found the container stopped
    re.compile(
        r'"ExecSync cmd from runtime service failed" err="rpc error: code = (Canceled desc = context canceled"'
        r'|(NotFound|Unknown) desc = failed to exec in container: (failed to create exec \\"\w+\\": '
        r"(container not created: not found|cannot exec in a (stopped|deleted) state|ttrpc: closed)"
        r'|failed to start exec \\"\w+\\": OCI runtime exec failed: exec failed: (cannot exec in a stopped container'
        r"|unable to start container process: error executing setns process: exit status 1)"
        r"|failed to load task: no running task found: not found"
        r'|container is in CONTAINER_EXITED state)")'
    ),
)
PLUGIN_CONTAINER = "plugin"
_SAYS_ERROR = re.compile(r"\b(ERROR|Error|error|WARNING|Traceback|FATAL|panic)\b")


class DriverLogs:
    """The container logs of `namespace`'s pods on the node whose kubelet writes pod logs to `pod_logs` and its own
    log to `kubelet_log`, from `start` on; `words` pick the kubelet's lines about the driver."""

    def __init__(
        self, pod_logs: Path, kubelet_log: Path, namespace: str, keep: Path, words: Iterable[str], interval: float = 0.2
    ) -> None:
        self._pod_logs, self._kubelet_log, self._keep = pod_logs, kubelet_log, keep
        self._prefix = f"{namespace}_"
        self._words = tuple(words)
        self._interval = interval
        self._kubelet_offset = 0
        self._expected: list[re.Pattern[str]] = list(KUBELET_ROUTINE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # pods of the namespace already on the node at the first start: a previous release's, still terminating
        self._before: frozenset[str] | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._keep.mkdir(parents=True, exist_ok=True)
        if self._before is None:
            self._before = frozenset(self._namespace_pods())
        try:
            self._kubelet_offset = self._kubelet_log.stat().st_size
        except FileNotFoundError:
            self._kubelet_offset = 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="driver-logs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop keeping new files (after one last look)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
        self._link_new()

    def expect(self, *patterns: str) -> None:
        """Lines a test causes on purpose: a problem line matching one of these regexes is not reported."""
        self._expected += [re.compile(p) for p in patterns]

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._link_new()

    def _namespace_pods(self) -> list[str]:
        """The names of the pod log directories of the namespace (`<namespace>_<pod>_<uid>`)."""
        try:
            return [d.name for d in os.scandir(self._pod_logs) if d.name.startswith(self._prefix)]
        except FileNotFoundError:
            return []

    def _link_new(self) -> None:
        for pod in self._namespace_pods():
            if self._before is not None and pod in self._before:
                continue
            for path in (self._pod_logs / pod).glob("*/*.log*"):
                kept = self._keep / path.relative_to(self._pod_logs)
                if kept.exists():
                    continue
                try:
                    # below `keep` only: a keeper still running while the node's work dir is removed must not put
                    # the directory back (FileNotFoundError here is that removal)
                    kept.parent.parent.mkdir(exist_ok=True)
                    kept.parent.mkdir(exist_ok=True)
                except FileNotFoundError:
                    return
                try:
                    os.link(path, kept)
                except (FileNotFoundError, FileExistsError):  # deleted (or rotated) between the glob and the link
                    continue

    def driver_lines(self) -> list[str]:
        """Every line the driver's containers wrote, each as `<pod dir>/<container>: <text>`."""
        out = []
        for path in sorted(self._keep.glob("*/*/*.log*")):
            where = f"{path.parent.parent.name}/{path.parent.name}"
            for raw in path.read_text(errors="replace").splitlines():
                m = _CRI_LINE.match(raw)
                out.append(f"{where}: {m.group(2) if m else raw}")
        return out

    def kubelet_lines(self) -> list[str]:
        """The kubelet's lines since `start` that name the driver."""
        with self._kubelet_log.open("rb") as f:
            f.seek(self._kubelet_offset)
            text = f.read().decode(errors="replace")
        return [line for line in text.splitlines() if any(w in line for w in self._words)]

    def problems(self) -> list[str]:
        """The lines a clean run must not have, less the expected ones."""
        found = [line for line in self.driver_lines() if _driver_problem(*line.split(": ", 1))]
        found += [f"kubelet: {line}" for line in self.kubelet_lines() if _KLOG_PROBLEM.match(line)]
        return [line for line in found if not any(p.search(line) for p in self._expected)]


def _driver_problem(where: str, text: str) -> bool:
    """`where`: <pod dir>/<container>."""
    if not text.strip():
        return False
    try:
        line = json.loads(text)
    except ValueError:
        # not one of our JSON lines: in the plugin, a bare traceback or a library's own output
        return where.endswith("/" + PLUGIN_CONTAINER) or bool(_SAYS_ERROR.search(text))
    return not isinstance(line, dict) or line.get("level") in _PROBLEM_LEVELS
