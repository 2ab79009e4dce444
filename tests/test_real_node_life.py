"""Life events on the real node with the driver deployed by its chart: a kubelet restart with prepared claims, the
driver pod deleted and recreated, the driver container SIGKILLed during a prepare, and a DaemonSet rolling update
with surge (two driver pods on the node at once, on the node's network, sharing the metrics port). After each,
running pods keep their devices, new claims prepare, and deleting the pods leaves no CDI spec, checkpoint entry or
MIG instance behind."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.node import Node
from tests.cluster.prometheus import MetricsWatch
from tests.polling import wait_until
from tests.test_real_pods import GPU, NS, Cluster, deployed, mig, pod, req, template

CRASH_MARKER = "/var/lib/dra-driver/sim/crashed-once"  # in the chart's sim-state hostPath: survives a restart


@pytest.fixture(scope="module")
def cluster(real_node: Node) -> Iterator[Cluster]:
    with deployed(real_node) as c:
        c.apply(template("one-gpu", req("gpu", GPU)), template("one-1g", req("gpu", mig("1g.10gb"))))
        yield c


def kubelet_log_count(node: Node, text: str) -> int:
    return node.kubelet_log.read_text(errors="replace").count(text)


def driver_pod(cluster: Cluster) -> dict[str, Any]:
    """The Ready driver pod (a restarted container is Ready again once its sockets answer the readiness probe)."""
    return cluster.release.wait_ready_pod()


def delete_and_check_clean(cluster: Cluster, *names: str, mig_left: Sequence[tuple[int, int, int]] = ()) -> None:
    """The pods deleted, their claims unprepared: no CDI spec or checkpoint entry left, and no MIG instance but
    `mig_left` (ones the driver did not make, which it never destroys)."""
    cluster.cp.delete("pod", *names, namespace=NS, missing_ok=False, wait=120)
    wait_until("claim specs removed", lambda: cluster.claim_specs() == [], timeout=60)
    wait_until("checkpoint empty", lambda: cluster.release.checkpoint_claims() == {}, timeout=30)
    assert cluster.mig_instances() == list(mig_left)


def test_a_kubelet_restart_deletes_and_republishes_slices_and_running_pods_keep_their_devices(
    cluster: Cluster,
) -> None:
    node = cluster.node
    cluster.apply(pod("before-restart", template_name="one-gpu"))
    before = cluster.wait_running("before-restart")
    seen = cluster.check_sees_its_devices("before-restart")
    deleted = kubelet_log_count(node, "Deleted ResourceSlices")
    registered = cluster.release.registrations()

    node.restart_kubelet()
    # the new kubelet wipes the node's slices and the driver publishes them again; the plugin registers again
    wait_until("slices deleted by the kubelet", lambda: kubelet_log_count(node, "Deleted ResourceSlices") > deleted)
    cluster.release.wait_registered(time.monotonic() + 60, registrations=registered + 1)
    after = cluster.cp.kubectl_json("get", "pod", "before-restart", "-n", NS)
    status, old = after["status"]["containerStatuses"][0], before["status"]["containerStatuses"][0]
    assert after["status"]["phase"] == "Running" and status["restartCount"] == 0
    assert status["containerID"] == old["containerID"]
    # the restarted kubelet serves the container's log again (NotFound until it has synced the pod)
    wait_until("the same view", lambda: cluster.seen("before-restart") == seen, timeout=30, tolerate_errors=True)
    # a new claim after the restart
    cluster.apply(pod("after-restart", template_name="one-1g"))
    cluster.wait_running("after-restart")
    cluster.check_sees_its_devices("after-restart")
    delete_and_check_clean(cluster, "before-restart", "after-restart")


def test_a_recreated_driver_pod_unprepares_what_the_old_one_prepared(cluster: Cluster) -> None:
    cluster.apply(pod("outlives-driver", template_name="one-1g"))
    cluster.wait_running("outlives-driver")
    old = driver_pod(cluster)["metadata"]["name"]
    registered = cluster.release.registrations()
    cluster.cp.delete("pod", old, namespace=cluster.release.namespace, missing_ok=False, wait=120)
    fresh = cluster.release.wait_registered(time.monotonic() + 90, registrations=registered + 1)
    assert fresh["metadata"]["name"] != old
    assert cluster.cp.kubectl_json("get", "pod", "outlives-driver", "-n", NS)["status"]["phase"] == "Running"
    assert len(cluster.claim_specs()) == 1  # the new instance found the claim in the checkpoint
    delete_and_check_clean(cluster, "outlives-driver")


def test_a_driver_killed_during_a_prepare_is_restarted_and_the_kubelet_retries(cluster: Cluster) -> None:
    release = cluster.release
    crash = [
        "--set", "extraEnv[2].name=DRA_DRIVER_CRASH_AT", "--set-string", "extraEnv[2].value=prepare.cdi-written",
        "--set", "extraEnv[3].name=DRA_DRIVER_CRASH_ONCE", "--set-string", f"extraEnv[3].value={CRASH_MARKER}",
    ]  # fmt: skip
    # the SIGKILL ends the kubelet's health stream abruptly, and the restarted driver undoes the interrupted claim
    release.log.expect(
        r'"Error receiving from WatchResources stream" err="rpc error: code = Unavailable desc = error reading from '
        r'server: EOF"',
        r"undoing claim e2e/survives-crash-gpu-\S+ \([-0-9a-f]+\), interrupted in PrepareStarted",
    )
    release.install(*crash)  # a rollout: the new pod carries the crash point
    marker = release.sim_state / "crashed-once"
    marker.unlink(missing_ok=True)
    before = int(driver_pod(cluster)["status"]["containerStatuses"][0]["restartCount"])

    cluster.apply(pod("survives-crash", template_name="one-1g"))
    cluster.wait_running("survives-crash", timeout=180)  # prepare killed after the CDI write; kubelet retried
    assert marker.exists()
    status = driver_pod(cluster)["status"]["containerStatuses"][0]
    assert status["restartCount"] == before + 1
    assert status["lastState"]["terminated"]["exitCode"] == 137
    cluster.check_sees_its_devices("survives-crash")
    assert len(cluster.mig_instances()) == 1  # the retried prepare reused what the killed one made, no leak
    delete_and_check_clean(cluster, "survives-crash")
    release.install()  # back to no crash point


def test_a_rolling_update_with_surge_keeps_serving(cluster: Cluster) -> None:
    """On the node's network (hostNetwork, as this node's chart values have it) with the metrics port on: both pods
    listen on the node's port (SO_REUSEPORT), so the update surges, and neither the kubelet's plugin nor the metrics
    endpoint is missing for a moment."""
    release = cluster.release
    registry = release.node.kubelet_dir / "plugins_registry"
    old = driver_pod(cluster)["metadata"]["name"]
    cluster.apply(pod("across-update", template_name="one-1g"))
    cluster.wait_running("across-update")
    lines_before = len(release.node.kubelet_log.read_text(errors="replace").splitlines())
    scrapes = MetricsWatch(release.metrics).start()
    release.install("--set-string", "podAnnotations.revision=2", wait=False)
    ds = cluster.cp.kubectl_json("get", "daemonset", release.release, "-n", release.namespace)
    assert ds["spec"]["template"]["spec"]["hostNetwork"] is True
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 1

    def two_registered() -> bool:
        # the kubelet counts the instances it holds for the driver: 2 while both pods serve
        log = release.node.kubelet_log.read_text(errors="replace").splitlines()[lines_before:]
        return any("Registered DRA plugin" in line and "numPlugins=2" in line for line in log)

    wait_until("old and new driver registered side by side", two_registered, timeout=120)
    wait_until("the old pod gone", lambda: old not in [p["metadata"]["name"] for p in release.pods()], timeout=120)
    release.wait_rollout(time.monotonic() + 120)
    answered, failed = scrapes.stop()
    assert answered > 10 and not failed, f"{answered} scrapes answered during the update; failed: {failed[:5]}"
    log = release.node.kubelet_log.read_text(errors="replace").splitlines()[lines_before:]
    gaps = [line for line in log if "Unregistered DRA plugin" in line and "numPlugins=0" in line]
    assert not gaps, gaps  # the kubelet never held no instance of the driver
    wait_until("one registration socket", lambda: len(list(registry.glob(f"{D}-*-reg.sock"))) == 1, timeout=60)
    (sock,) = registry.glob(f"{D}-*-reg.sock")
    assert driver_pod(cluster)["metadata"]["uid"] in sock.name  # the new instance's own socket survived the old
    # the claim the old pod prepared is unprepared by the new one; a new claim prepares
    cluster.apply(pod("after-update", template_name="one-gpu"))
    cluster.wait_running("after-update")
    cluster.check_sees_its_devices("after-update")
    delete_and_check_clean(cluster, "across-update", "after-update")
