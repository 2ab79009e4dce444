"""A stand-in for the kubelet that talks to the plugin over its real Unix sockets.

It does what the kubelet's plugin watcher and DRA manager do (kubernetes ``pkg/kubelet/pluginmanager`` and
``pkg/kubelet/cm/dra/plugin``): find ``*-reg.sock`` in the plugin registry directory (for a known driver
``<driver>-reg.sock``, or ``<driver>-<pod uid>-reg.sock`` of a plugin started with a pod UID), call ``GetInfo``,
validate the answer, report the verdict with ``NotifyRegistrationStatus``, then dial the advertised endpoint and call
``NodePrepareResources`` / ``NodeUnprepareResources`` with a 45 s timeout, preferring the v1 service over v1beta1.
With two instances of a driver serving side by side (a rolling update), one harness per instance plays the kubelet's
connection to it: pass the socket to :meth:`KubeletHarness.register`.

Responses are decoded into the plugin's device type (:class:`PrepareAnswer` holds them, with the error text the
kubelet reads), so tests can compare them with what the fake preparer returned; the ``*_raw`` variants return the
protobuf messages.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from pydantic import BaseModel

from dra_driver.plugin.grpc import resource_health
from dra_driver.plugin.grpc.generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dra_driver.plugin.types import ClaimRef, PreparedDevice

KUBELET_CALL_TIMEOUT_S = 45.0  # defaultClientCallTimeout in the kubelet's DRA plugin client
CONNECT_TIMEOUT_S = 5.0  # the kubelet waits 1 s; a loaded test machine needs more
DRA_PLUGIN_TYPE = "DRAPlugin"
VERSION_PREFERENCE = ("v1", "v1beta1")  # what the kubelet prefers, first first
# API version -> (messages, generated service code)
DRA_MODULES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


class PrepareAnswer(BaseModel):
    """A claim's entry in a NodePrepareResources response: its devices, or the error text the kubelet gets."""

    devices: list[PreparedDevice] = []
    error: str = ""


class RegistrationError(RuntimeError):
    """The plugin's GetInfo answer was rejected (the harness told the plugin so, like the kubelet)."""


@dataclass(frozen=True)
class PluginInfo:
    """A decoded GetInfo answer."""

    type: str
    name: str
    endpoint: str
    supported_versions: list[str] = field(default_factory=list)


def _unix_target(path: Path | str) -> str:
    return f"unix:{path}"


def _wait_ready(channel: grpc.Channel, target: str, timeout: float) -> None:
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError as exc:
        raise TimeoutError(f"cannot connect to {target} within {timeout} s") from exc


class KubeletHarness:
    """Plays the kubelet for one driver. Use as a context manager, or call :meth:`close`."""

    def __init__(self, registry_dir: Path | str, driver_name: str | None = None) -> None:
        self.registry_dir = Path(registry_dir)
        self.driver_name = driver_name
        self.info: PluginInfo | None = None
        self.registration_socket: Path | None = None
        self._dra_channel: grpc.Channel | None = None

    # -- registration

    def registration_sockets(self) -> list[Path]:
        """The registration sockets in the registry directory now: ``*-reg.sock``, or if the driver is known
        ``<driver>-reg.sock`` and ``<driver>-<pod uid>-reg.sock``; the newest first (the kubelet uses the plugin
        that registered last), then by name."""
        name = re.compile(rf"{re.escape(self.driver_name)}(-.+)?-reg\.sock" if self.driver_name else r".+-reg\.sock")
        found: list[tuple[int, str, Path]] = []
        try:
            names = [n for n in os.listdir(self.registry_dir) if name.fullmatch(n)]
        except (FileNotFoundError, NotADirectoryError):
            return []
        for n in names:
            candidate = self.registry_dir / n
            try:
                st = candidate.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found.append((-st.st_ctime_ns, n, candidate))
        return [path for *_, path in sorted(found)]

    def find_registration_socket(self, timeout: float = 10.0, poll_s: float = 0.05) -> Path:
        """Wait for a registration socket in the registry directory (:meth:`registration_sockets`; the newest).

        The kubelet uses inotify; polling is good enough here.
        """
        deadline = time.monotonic() + timeout
        while True:
            sockets = self.registration_sockets()
            if sockets:
                return sockets[0]
            if time.monotonic() >= deadline:
                what = f"{self.driver_name}[-<pod uid>]-reg.sock" if self.driver_name else "*-reg.sock"
                raise TimeoutError(f"no {what} socket appeared in {self.registry_dir} within {timeout} s")
            time.sleep(poll_s)

    def get_info(self, socket: Path | None = None) -> PluginInfo:
        """Call GetInfo on the registration socket (found if not given)."""
        path = socket or self.find_registration_socket()
        target = _unix_target(path)
        with grpc.insecure_channel(target) as channel:
            _wait_ready(channel, target, CONNECT_TIMEOUT_S)
            answer: Any = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=KUBELET_CALL_TIMEOUT_S
            )
        return PluginInfo(
            type=answer.type,
            name=answer.name,
            endpoint=answer.endpoint,
            supported_versions=list(answer.supported_versions),
        )

    def notify_registration_status(self, registered: bool, error: str = "", socket: Path | None = None) -> None:
        """Call NotifyRegistrationStatus (raises grpc.RpcError if the plugin returns an error)."""
        path = socket or self.find_registration_socket()
        target = _unix_target(path)
        with grpc.insecure_channel(target) as channel:
            _wait_ready(channel, target, CONNECT_TIMEOUT_S)
            pluginregistration_v1_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=registered, error=error),
                timeout=KUBELET_CALL_TIMEOUT_S,
            )

    @staticmethod
    def validate(info: PluginInfo, driver_name: str | None = None) -> list[str]:
        """What the kubelet would reject in a DRA plugin's GetInfo answer; empty if nothing."""
        problems: list[str] = []
        if info.type != DRA_PLUGIN_TYPE:
            problems.append(f"type is {info.type!r}, not {DRA_PLUGIN_TYPE!r}")
        if not info.name:
            problems.append("name is empty")
        elif driver_name is not None and info.name != driver_name:
            problems.append(f"name is {info.name!r}, not {driver_name!r}")
        if not any(f"{v}.{DRA_PLUGIN_TYPE}" in info.supported_versions for v in VERSION_PREFERENCE):
            problems.append(f"no supported DRA service among {info.supported_versions}")
        endpoint = Path(info.endpoint)
        if not endpoint.is_absolute():
            problems.append(f"endpoint {info.endpoint!r} is not an absolute path")
        else:
            try:
                if not stat.S_ISSOCK(endpoint.lstat().st_mode):
                    problems.append(f"endpoint {info.endpoint} is not a socket")
            except FileNotFoundError:
                problems.append(f"endpoint {info.endpoint} does not exist")
        return problems

    def register(self, timeout: float = 10.0, socket: Path | None = None) -> PluginInfo:
        """The whole handshake: find the socket (unless given), GetInfo, validate, NotifyRegistrationStatus.

        On a rejected answer it reports plugin_registered=false (as the kubelet does) and raises RegistrationError.
        """
        socket = socket or self.find_registration_socket(timeout)
        info = self.get_info(socket)
        problems = self.validate(info, self.driver_name)
        if problems:
            message = "; ".join(problems)
            # the plugin answers a failed registration with an error, as the Go helper does
            with contextlib.suppress(grpc.RpcError):
                self.notify_registration_status(False, message, socket)
            raise RegistrationError(message)
        self.notify_registration_status(True, "", socket)
        self.registration_socket = socket
        self.info = info
        return info

    # -- DRA service

    def _dra_modules(self, version: str | None) -> tuple[ModuleType, ModuleType]:
        if self.info is None:
            raise RuntimeError("register() first")
        if version is None:
            version = next(v for v in VERSION_PREFERENCE if f"{v}.{DRA_PLUGIN_TYPE}" in self.info.supported_versions)
        elif f"{version}.{DRA_PLUGIN_TYPE}" not in self.info.supported_versions:
            raise ValueError(f"the plugin does not offer {version}.{DRA_PLUGIN_TYPE}")
        if version not in DRA_MODULES:
            raise ValueError(f"unknown DRA API version {version!r}")
        return DRA_MODULES[version]

    def _channel(self) -> grpc.Channel:
        if self.info is None:
            raise RuntimeError("register() first")
        if self._dra_channel is None:
            target = _unix_target(self.info.endpoint)
            channel = grpc.insecure_channel(target)
            try:
                _wait_ready(channel, target, CONNECT_TIMEOUT_S)
            except BaseException:
                channel.close()
                raise
            self._dra_channel = channel
        return self._dra_channel

    @staticmethod
    def _claims(pb: ModuleType, claims: list[ClaimRef]) -> list[Any]:
        return [pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]

    def prepare_raw(
        self, claims: list[ClaimRef], version: str | None = None, timeout: float = KUBELET_CALL_TIMEOUT_S
    ) -> Any:
        """NodePrepareResources; returns the response message. ``version``: "v1", "v1beta1" or None (prefer v1)."""
        pb, pb_grpc = self._dra_modules(version)
        stub = pb_grpc.DRAPluginStub(self._channel())
        return stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=self._claims(pb, claims)), timeout=timeout
        )

    def unprepare_raw(
        self, claims: list[ClaimRef], version: str | None = None, timeout: float = KUBELET_CALL_TIMEOUT_S
    ) -> Any:
        """NodeUnprepareResources; returns the response message."""
        pb, pb_grpc = self._dra_modules(version)
        stub = pb_grpc.DRAPluginStub(self._channel())
        return stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=self._claims(pb, claims)), timeout=timeout
        )

    def prepare(
        self, claims: list[ClaimRef], version: str | None = None, timeout: float = KUBELET_CALL_TIMEOUT_S
    ) -> dict[str, PrepareAnswer]:
        """NodePrepareResources, decoded: claim UID -> PrepareAnswer."""
        response = self.prepare_raw(claims, version, timeout)
        decoded: dict[str, PrepareAnswer] = {}
        for uid, entry in response.claims.items():
            devices = [
                PreparedDevice(
                    requests=list(d.request_names),
                    pool=d.pool_name,
                    device=d.device_name,
                    cdi_device_ids=list(d.cdi_device_ids),
                    share_id=d.share_id
                    if "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id")
                    else None,
                )
                for d in entry.devices
            ]
            decoded[uid] = PrepareAnswer(devices=devices, error=entry.error)
        return decoded

    def unprepare(
        self, claims: list[ClaimRef], version: str | None = None, timeout: float = KUBELET_CALL_TIMEOUT_S
    ) -> dict[str, str]:
        """NodeUnprepareResources, decoded: claim UID -> error ("" on success)."""
        response = self.unprepare_raw(claims, version, timeout)
        return {uid: entry.error for uid, entry in response.claims.items()}

    def watch_resources(self, timeout: float | None = None) -> Any:
        """Open the ``v1alpha1.DRAResourceHealth/NodeWatchResources`` stream on the DRA endpoint, as the kubelet does
        (it opens one per plugin, without a deadline, whether or not the plugin lists the service). Returns an
        iterator of NodeWatchResourcesResponse messages that is also a grpc.Call (``cancel()`` ends it)."""
        return resource_health.watch_resources(self._channel(), timeout=timeout)

    def close(self) -> None:
        if self._dra_channel is not None:
            self._dra_channel.close()
            self._dra_channel = None

    def __enter__(self) -> KubeletHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
