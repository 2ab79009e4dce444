"""Per-node configuration on the real node (the chart's nodeConfigs, dra_driver/controller/nodeconfig.py): the
node's label switches what its daemon publishes within seconds and without a restart, running pods keep their
devices, and a switch that would break a prepared claim is refused with an Event until the claim is gone."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.node import Node
from tests.polling import wait_until
from tests.test_real_pods import GPU, NS, Cluster, deployed, pod, req, template

LABEL = f"{D}/config"
CONFIGS = {"whole": {"mode": "gpus"}, "shared-4": {"mode": "shared", "replicas": 4}}
SWITCH_S = 20.0  # "within seconds": the watch hears the label at once; the bound leaves room for a busy machine


@pytest.fixture(scope="module")
def cluster(real_node: Node) -> Iterator[Cluster]:
    with deployed(real_node, values=["--set-json", f"nodeConfigs.configs={json.dumps(CONFIGS)}"]) as c:
        # the refusal below is a warning on purpose
        c.release.log.expect(r"node configuration 'shared-4' not applied while prepared claims use")
        try:
            yield c
        finally:
            c.cp.kubectl("label", "node", c.node.name, f"{LABEL}-", check=False)


def label(cluster: Cluster, value: str | None) -> None:
    cluster.cp.kubectl("label", "node", cluster.node.name, f"{LABEL}-" if value is None else f"{LABEL}={value}",
                       "--overwrite")  # fmt: skip


def published(cluster: Cluster) -> tuple[set[str], set[str], set[str], list[dict[str, Any]]]:
    """(config labels, refusal annotations, device types, devices) of the node's slices."""
    slices = cluster.release.slices()
    meta = [s["metadata"] for s in slices]
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    types = {next(iter(d["attributes"]["type"].values())) for d in devices}
    refused = {(m.get("annotations") or {}).get(f"{D}/config-refused", "") for m in meta}
    return {(m.get("labels") or {}).get(LABEL, "") for m in meta}, refused, types, devices


def node_events(cluster: Cluster, reason: str) -> list[str]:
    listed = cluster.cp.kubectl_json("get", "events", "-n", "default", "--field-selector",
                                     f"involvedObject.name={cluster.node.name},reason={reason}")  # fmt: skip
    return [e["message"] for e in listed["items"]]


def test_the_label_switches_the_node_and_running_pods_keep_their_devices(cluster: Cluster) -> None:
    assert published(cluster)[0] == {"default"} and "mig" in published(cluster)[2]  # the chart's partitionable
    cluster.apply(template("one-gpu", req("gpu", GPU)), pod("keeps", template_name="one-gpu"))
    before = cluster.wait_running("keeps")
    seen = cluster.check_sees_its_devices("keeps")
    daemon = cluster.release.wait_ready_pod()
    start = time.monotonic()
    label(cluster, "whole")
    wait_until("the slices of configuration whole", lambda: published(cluster)[:3] == ({"whole"}, {""}, {"gpu"}),
               timeout=SWITCH_S)  # fmt: skip
    print(f"\nslices switched {time.monotonic() - start:.1f} s after the label")
    assert any("'whole' applied: mode gpus" in m for m in node_events(cluster, "NodeConfigApplied"))
    # no restart: the same daemon pod, its container never restarted; the running pod is untouched
    after = cluster.release.ready_pod()
    assert after is not None and after["metadata"]["uid"] == daemon["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == daemon["status"]["containerStatuses"][0][
        "restartCount"]  # fmt: skip
    now = cluster.cp.kubectl_json("get", "pod", "keeps", "-n", NS)
    assert now["status"]["phase"] == "Running" and now["metadata"]["uid"] == before["metadata"]["uid"]
    assert now["status"]["containerStatuses"][0]["restartCount"] == 0
    assert cluster.seen("keeps") == seen
    assert len(cluster.release.checkpoint_claims()) == 1


def test_a_switch_that_would_break_a_prepared_claim_is_refused_until_it_is_gone(cluster: Cluster) -> None:
    label(cluster, "shared-4")  # "keeps" holds gpu-N alone; shared mode would publish it for several claims

    def refused() -> bool:
        labels, annotations, _, _ = published(cluster)
        return labels == {"whole"} and any("'shared-4' not applied" in a for a in annotations)

    wait_until("the refusal on the slices", refused, timeout=SWITCH_S)
    (message,) = wait_until("the Warning event", lambda: node_events(cluster, "NodeConfigRefused"), timeout=SWITCH_S)
    assert f"{NS}/" in message and "'whole' stays" in message
    assert cluster.cp.kubectl_json("get", "pod", "keeps", "-n", NS)["status"]["phase"] == "Running"
    cluster.cp.delete("pod", "keeps", namespace=NS, missing_ok=False, wait=120)

    def shared() -> bool:
        labels, annotations, _, devices = published(cluster)
        shares = {(d.get("capacity") or {}).get("shares", {}).get("value") for d in devices}
        return labels == {"shared-4"} and annotations == {""} and shares == {"4"}

    wait_until("configuration shared-4 applied once the claim is gone", shared, timeout=SWITCH_S + 30)
    label(cluster, None)

    def default_again() -> bool:  # one read: a pool being republished can carry the label before all its devices
        labels, _, types, _ = published(cluster)
        return labels == {"default"} and "mig" in types

    wait_until("back to the chart's own mode, its MIG devices included", default_again, timeout=SWITCH_S)
