"""Per-node configuration (dra_driver.controller.nodeconfig): the named configurations, the label's value applied
or refused with a reason, and, against the real API server, the label followed by a watch and the Events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.controller.nodeconfig import (
    DEFAULT_NAME,
    NodeConfig,
    NodeConfigurator,
    NodeLabelWatch,
    load_configs,
)
from dra_driver.kube.events import node_event_poster
from dra_driver.slices.devices import PublishMode
from tests.polling import wait_until

STATIC = NodeConfig(mode=PublishMode.STATIC)


def test_configurations_load_and_bad_ones_are_named(tmp_path: Path) -> None:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"shared-4": {"mode": "shared", "replicas": 4},
                                "any": {"mode": "shared", "replicas": "unlimited"},
                                "mig": {"mode": "partitionable"}}))  # fmt: skip
    configs = load_configs(path)
    assert configs["shared-4"] == NodeConfig(mode=PublishMode.SHARED, replicas=4)
    path.write_text(json.dumps({"mps-30": {"mode": "gpus", "mps": {"defaultActiveThreadPercentage": 30}},
                                "bad-mps": {"mode": "gpus", "mps": {"defaultActiveThreadPercentage": 0}}}))  # fmt: skip
    with pytest.raises(ValueError, match=r"'bad-mps'.*defaultActiveThreadPercentage"):
        load_configs(path)
    path.write_text(json.dumps({"shared-4": {"mode": "shared", "replicas": 4},
                                "any": {"mode": "shared", "replicas": "unlimited"},
                                "mig": {"mode": "partitionable"}}))  # fmt: skip
    configs = load_configs(path)
    assert configs["any"].replicas == 0 and configs["mig"].replicas is None
    path.write_text(json.dumps({"small-mig": {"mode": "partitionable", "migProfiles": ["1g.10gb", "3g.40gb"]}}))
    assert load_configs(path)["small-mig"].mig_profiles == frozenset({"1g.10gb", "3g.40gb"})
    for body, words in (
        ({"x": {"mode": "static", "replicas": 4}}, "'x'.*replicas apply to mode shared only"),
        ({"x": {"mode": "everything"}}, "'x'.*mode"),
        ({"x": {"mode": "shared", "replicas": 0}}, "'x'.*replicas must be 1 or more, or 'unlimited'"),
        ({"x": {"mode": "shared", "replicas": 4.5}}, "'x'.*not a number of replicas"),
        ({"x": {"mode": "static", "colour": "red"}}, "'x'.*colour"),
        ({"x": {"mode": "static", "migProfiles": ["1g.10gb"]}}, "'x'.*migProfiles apply to mode partitionable only"),
        ({"x": {"mode": "partitionable", "migProfiles": ["1g"]}}, "'x'.*invalid MIG profile name '1g'"),
        ({"x": {"mode": "partitionable", "migProfiles": 7}}, "'x'.*a list of MIG profile names"),
        ({DEFAULT_NAME: {"mode": "static"}}, "daemon's own flags"),
        ({"two words": {"mode": "static"}}, "not a label value"),
        (["static"], "an object of named configurations"),
    ):
        path.write_text(json.dumps(body))
        with pytest.raises(ValueError, match=words):
            load_configs(path)


class Fake:
    """The daemon's side: the plugin's switch (claims in the way, or none), republishes and Events."""

    def __init__(self) -> None:
        self.blockers: list[str] = []
        self.mode = PublishMode.STATIC
        self.changes = 0
        self.events: list[tuple[str, str, str]] = []

    def switch(self, config: NodeConfig) -> list[str]:
        if self.blockers:
            return list(self.blockers)
        self.mode = config.mode
        return []

    def configurator(self, configs: dict[str, NodeConfig]) -> NodeConfigurator:
        return NodeConfigurator(configs, STATIC, self.switch, self.changed, lambda *e: self.events.append(e))

    def changed(self) -> None:
        self.changes += 1


def test_the_label_applies_a_configuration_or_is_refused_until_the_claims_are_gone() -> None:
    fake = Fake()
    shared = NodeConfig(mode=PublishMode.SHARED, replicas=4)
    c = fake.configurator({"shared-4": shared, "mig": NodeConfig(mode=PublishMode.PARTITIONABLE)})
    assert c.current.name == DEFAULT_NAME and c.current.config == STATIC
    c.label_changed("shared-4")
    assert (c.current.name, c.current.config, c.current.refused) == ("shared-4", shared, None)
    assert fake.mode is PublishMode.SHARED and fake.changes == 1
    assert fake.events[-1][:2] == ("Normal", "NodeConfigApplied") and "replicas 4" in fake.events[-1][2]
    c.label_changed("shared-4")  # the same again: nothing
    assert fake.changes == 1 and len(fake.events) == 1

    fake.blockers = ["e2e/a: gpu-0", "e2e/b: gpu-1"]
    c.label_changed("mig")
    assert c.current.name == "shared-4" and c.current.config == shared  # kept
    assert c.current.refused is not None and "e2e/a: gpu-0, e2e/b: gpu-1" in c.current.refused
    assert fake.events[-1][:2] == ("Warning", "NodeConfigRefused") and "'shared-4' stays" in fake.events[-1][2]
    events = len(fake.events)
    c.retry()  # still in the way: no new Event for the same reason
    assert len(fake.events) == events and fake.mode is PublishMode.SHARED
    fake.blockers = []
    c.retry()
    assert (c.current.name, c.current.refused, fake.mode) == ("mig", None, PublishMode.PARTITIONABLE)
    assert fake.events[-1][:2] == ("Normal", "NodeConfigApplied")

    c.label_changed("nonesuch")
    assert c.current.name == "mig" and c.current.refused and "known: mig, shared-4" in c.current.refused
    c.label_changed("mig")  # back to what runs: the refusal goes
    assert c.current.refused is None
    c.label_changed(None)  # the label removed: the daemon's own flags
    assert (c.current.name, c.current.config, fake.mode) == (DEFAULT_NAME, STATIC, PublishMode.STATIC)


def test_the_label_is_followed_by_a_watch_and_events_reach_the_node(control_plane) -> None:
    from dra_driver.kube.rest import connect

    cp = control_plane
    node = "nodeconfig-watch"
    cp.create_node(node)
    rest = connect(cp.kubeconfig)
    seen: list[str | None] = []
    watch = NodeLabelWatch(rest, node, "gpu.dra-driver.dev/config", seen.append, watch_seconds=5, retry_s=0.2)
    watch.start()
    try:
        wait_until("the unlabelled node listed", lambda: seen == [None], timeout=20)
        cp.kubectl("label", "node", node, "gpu.dra-driver.dev/config=shared-4")
        wait_until("the label seen", lambda: seen[-1:] == ["shared-4"], timeout=20)
        cp.kubectl("label", "node", node, "gpu.dra-driver.dev/config-")
        wait_until("its removal seen", lambda: seen[-1:] == [None], timeout=20)
    finally:
        watch.stop()
    post = node_event_poster(rest, node, "gpu.dra-driver.dev")
    post("Warning", "NodeConfigRefused", 'node configuration "mig" not applied: e2e/a: gpu-0')

    def events() -> list[dict[str, Any]]:
        listed = cp.kubectl_json("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={node}")
        return list(listed["items"])

    (event,) = wait_until("the event", events, timeout=20)
    assert (event["type"], event["reason"], event["involvedObject"]["kind"]) == ("Warning", "NodeConfigRefused", "Node")
    assert "e2e/a: gpu-0" in event["message"]
    cp.delete("node", node, missing_ok=False)
