"""Kubernetes Events about this node: what the daemon reports to whoever runs `kubectl describe node`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dra_driver.kube.rest import KubeRest, path_of

log = logging.getLogger(__name__)

EVENT_TIMEOUT_S = 5.0


def node_event_poster(rest: KubeRest, node_name: str, component: str) -> Callable[[str, str, str], None]:
    """`post(type, reason, message)`: a core/v1 Event about the Node, as the kubelet writes them (namespace
    default, the node's name as its uid). A failure is logged, never raised: an Event is a report, not a step."""

    def post(event_type: str, reason: str, message: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node_name}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name},
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component, "host": node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            rest.request("POST", path_of("", "v1", "events", namespace="default"), body=body, timeout=EVENT_TIMEOUT_S)
        except Exception as e:
            log.warning("event %s on node %s not recorded: %s", reason, node_name, e)

    return post
