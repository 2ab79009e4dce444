"""Per-node configuration: a label on the Node names one of the configurations the chart lists (what the node
publishes: mode and replicas; the MPS defaults of its claims), as the device plugin's
`nvidia.com/device-plugin.config` label does. Without the label the node runs the daemon's own flags.

A change of the label is applied at once unless a prepared claim holds a device the new configuration would not
publish the same way (a MIG partition carved on demand, a GPU shared by replicas): then the node keeps its
configuration, says why in a Warning Event on the Node and in an annotation of its ResourceSlices, and tries again
whenever the claims change, until the label's configuration can be applied (or the label changes back). New MPS
defaults apply to the claims prepared after the change.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dra_driver.claimstate.config import MpsConfig
from dra_driver.kube import listwatch
from dra_driver.kube.rest import KubeRest, path_of
from dra_driver.slices.devices import (
    UNLIMITED_REPLICAS,
    PublishMode,
    check_mig_profiles,
    check_replicas,
    parse_mig_profiles,
    parse_replicas,
)

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
LIST_TIMEOUT_S = 10.0
RETRY_S = 5.0
DEFAULT_NAME = "default"  # the daemon's own flags, when the Node has no label
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


class NodeConfig(BaseModel):
    """What one named configuration sets."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    mode: PublishMode
    replicas: int | None = None  # shared mode: None by memory, 0 unlimited, N claims per GPU
    # partitionable mode: the MIG profiles published, e.g. ["1g.10gb", "3g.40gb"] (None: every one); fewer devices
    # cost the scheduler less on every node it tries (docs/resourceslices.md)
    mig_profiles: frozenset[str] | None = Field(default=None, alias="migProfiles")
    # what an MPS claim's config leaves out (its defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit)
    mps: MpsConfig | None = None

    @field_validator("replicas", mode="before")
    @classmethod
    def _words(cls, value: Any) -> Any:
        return None if value is None or value == "" else parse_replicas(value)

    @field_validator("mig_profiles", mode="before")
    @classmethod
    def _profiles(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str | list | tuple | frozenset | set):
            raise ValueError("a list of MIG profile names expected")
        return parse_mig_profiles(sorted(value) if isinstance(value, frozenset | set) else value)

    @model_validator(mode="after")
    def _fits(self) -> NodeConfig:
        check_replicas(self.replicas, self.mode)
        check_mig_profiles(self.mig_profiles, self.mode)
        return self


def load_configs(path: Path) -> dict[str, NodeConfig]:
    """`{name: {mode, replicas, migProfiles, mps}}` from a JSON file (the chart's ConfigMap); ValueError naming what
    is wrong."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"node configurations {path}: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"node configurations {path}: an object of named configurations expected")
    configs = {}
    for name, body in raw.items():
        if name == DEFAULT_NAME:
            raise ValueError(f"node configurations {path}: {DEFAULT_NAME!r} is the daemon's own flags")
        if not _LABEL_VALUE.fullmatch(name):
            raise ValueError(f"node configurations {path}: {name!r} is not a label value (what a node label names)")
        try:
            configs[name] = NodeConfig.model_validate(body)
        except ValidationError as e:
            why = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'value'}: {x['msg']}" for x in e.errors())
            raise ValueError(f"node configuration {name!r} in {path}: {why}") from None
    return configs


@dataclass(frozen=True)
class Selection:
    """The configuration the node runs, and why the label's is not applied (None when it is)."""

    name: str
    config: NodeConfig
    refused: str | None = None


class NodeConfigurator:
    """Applies the configuration the label names. `switch(config)` switches the plugin and returns the claims in
    the way (nothing switched then); `on_change` republishes; `event(type, reason, message)` reports on the Node."""

    def __init__(
        self,
        configs: dict[str, NodeConfig],
        default: NodeConfig,
        switch: Callable[[NodeConfig], list[str]],
        on_change: Callable[[], None],
        event: Callable[[str, str, str], None],
    ) -> None:
        self._configs, self._default = configs, default
        self._switch, self._on_change, self._event = switch, on_change, event
        self._lock = threading.Lock()
        self._wanted = DEFAULT_NAME
        self._current = Selection(DEFAULT_NAME, default)

    @property
    def current(self) -> Selection:
        return self._current

    def label_changed(self, value: str | None) -> None:
        with self._lock:
            self._wanted = value or DEFAULT_NAME
            self._apply()

    def retry(self) -> None:
        """After the claims changed: apply a refused configuration if nothing is in its way now."""
        with self._lock:
            if self._current.refused is not None:
                self._apply()

    def _apply(self) -> None:
        name, current = self._wanted, self._current
        config = self._default if name == DEFAULT_NAME else self._configs.get(name)
        if config is None:
            known = ", ".join(sorted(self._configs)) or "none"
            self._refuse(name, f"node configuration {name!r} is not one of the chart's (known: {known})")
            return
        if name == current.name and config == current.config:
            if current.refused is not None:  # the label went back to what runs
                self._set(Selection(name, config))
            return
        blockers = self._switch(config) if config != current.config else []
        if blockers:
            shown = ", ".join(blockers[:5]) + (f" and {len(blockers) - 5} more" if len(blockers) > 5 else "")
            self._refuse(name, f"node configuration {name!r} not applied while prepared claims use devices it "
                               f"would not publish the same way: {shown}; {current.name!r} stays")  # fmt: skip
            return
        self._set(Selection(name, config))
        log.info("node configuration %r applied: %s", name, _describe(config))
        self._event("Normal", "NodeConfigApplied", f"node configuration {name!r} applied: {_describe(config)}")

    def _refuse(self, name: str, why: str) -> None:
        current = self._current
        if current.refused == why:
            return
        self._set(Selection(current.name, current.config, why))
        log.warning("%s", why)
        self._event("Warning", "NodeConfigRefused", why)

    def _set(self, selection: Selection) -> None:
        self._current = selection
        self._on_change()


def _describe(config: NodeConfig) -> str:
    parts = [f"mode {config.mode.value}"]
    if config.replicas is not None:
        parts.append(f"replicas {'unlimited' if config.replicas == UNLIMITED_REPLICAS else config.replicas}")
    if config.mig_profiles is not None:
        parts.append(f"MIG profiles {', '.join(sorted(config.mig_profiles))}")
    if config.mps is not None:
        parts.append(f"MPS defaults {config.mps.model_dump_json(by_alias=True, exclude_none=True)}")
    return ", ".join(parts)


class NodeLabelWatch:
    """Follows one label of this node's Node object (a list and watch of that one object) and calls `on_value`
    with its value (None: no such label) at every list and every change."""

    def __init__(
        self,
        rest: KubeRest,
        node_name: str,
        label: str,
        on_value: Callable[[str | None], None],
        watch_seconds: int = WATCH_SECONDS,
        retry_s: float = RETRY_S,
    ) -> None:
        self._rest, self._label, self._on_value = rest, label, on_value
        self._path = path_of("", "v1", "nodes")
        self._selector = f"metadata.name={node_name}"
        self._seconds, self._retry_s = watch_seconds, retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-config-label", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=0.1)  # a watch blocked in a read ends with its server-side timeout

    def _run(self) -> None:
        listwatch.run(
            f"node label {self._label}",
            lambda: listwatch.list_at(self._rest, self._path, LIST_TIMEOUT_S, fieldSelector=self._selector),
            lambda version, stop: listwatch.watch_from(
                self._rest, self._path, version, self._seconds, stop, fieldSelector=self._selector
            ),
            lambda items: self._seen(items[0] if items else None),
            lambda kind, obj: self._seen(obj) if kind in ("ADDED", "MODIFIED") else None,
            lambda: None,  # the node keeps the configuration it has until the label is seen again
            self._stop,
            self._retry_s,
        )

    def _seen(self, node: dict[str, Any] | None) -> None:
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        self._on_value(labels.get(self._label))
