"""Names, sizes and versions checked with regular expressions refuse a trailing newline, as Go's `$` does
(Python's `$` also matches before a final newline)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.api.quantity import QuantityError, parse_quantity
from dra_driver.cel.errors import EvalError
from dra_driver.cel.semver import Semver
from dra_driver.claimstate.config import ConfigError, pinned_limit_mib
from dra_driver.nvml.migprofile import parse_profile_name
from dra_driver.sharing.mps_control_daemon import MpsSettings, parse_pinned
from dra_driver.sharing.mps_deployment import pod_name
from dra_driver.slices.naming import parse_device_name


@pytest.mark.parametrize(
    ("parse", "text", "error"),
    [
        (parse_quantity, "1Gi\n", QuantityError),
        (parse_quantity, "Gi\n", QuantityError),
        (pinned_limit_mib, "1Gi\n", ConfigError),
        (pinned_limit_mib, "1e999999999\n", ConfigError),
        (Semver, "1.2.3\n", EvalError),
        (lambda text: Semver(text, normalize=True), "v1.2-rc\n", EvalError),
        (parse_device_name, "gpu-0\n", ValueError),
        (parse_device_name, "gpu-0-mig-1g10gb-19-0\n", ValueError),
        (parse_profile_name, "1g.10gb\n", ValueError),
        (parse_pinned, "0=1024M\n", ValueError),
        (lambda text: MpsSettings(pinned_mem_limits=((0, text),)), "1024M\n", ValueError),
    ],
)
def test_a_trailing_newline_is_refused(parse: Callable[[str], Any], text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse(text)


def test_a_claim_uid_with_a_trailing_newline_is_hashed_into_the_pod_name() -> None:
    uid = "0b5e2f0c-1d2e-4f3a-9b8c-7d6e5f4a3b2c"
    assert pod_name(uid).endswith(uid)
    assert "\n" not in pod_name(uid + "\n")
