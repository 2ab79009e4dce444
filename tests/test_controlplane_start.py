"""A control plane whose component finds its port taken (free_port's port bound by another process in between, as
the other pytest worker's components once did to etcd in CI) starts again on new ports instead of failing."""

from __future__ import annotations

import socket

import pytest

from tests.cluster import controlplane
from tests.cluster.controlplane import ControlPlane


def test_a_port_taken_before_etcd_binds_it_is_retried_on_new_ports(
    monkeypatch: pytest.MonkeyPatch, control_plane: ControlPlane
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        real, handed = controlplane.free_port, []

        def first_one_taken() -> int:
            handed.append(port if not handed else real())
            return handed[-1]

        monkeypatch.setattr(controlplane, "free_port", first_one_taken)
        with ControlPlane(bin_dir=control_plane.bin_dir) as cp:
            assert cp.etcd_port != port and cp.server_version() == control_plane.server_version()
    assert handed[0] == port  # etcd got the taken port first
