"""A list, then a watch from the list's resourceVersion, again and again: what an informer does, for one kind of
object. A failed list or a broken watch (the API server away, 410 Gone) is logged once per outage and retried
after `retry_s`; the caller is told (`on_lost`) so it stops trusting what it holds."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from dra_driver.kube.rest import KubeRest

log = logging.getLogger(__name__)

ListResult = tuple[list[dict[str, Any]], str]


def list_at(rest: KubeRest, path: str, timeout: float, **query: Any) -> ListResult:
    """The items of `path` and the list's resourceVersion."""
    got: Any = rest.get(path, timeout=timeout, **query)
    return list(got.get("items") or []), str(got["metadata"]["resourceVersion"])


def watch_from(
    rest: KubeRest, path: str, resource_version: str, seconds: int, stop: threading.Event, **query: Any
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, object) until the server ends the watch or `stop` is set; an ERROR event raises."""
    events = rest.watch(path, resource_version=resource_version, seconds=seconds, **query)
    try:
        for kind, obj in events:
            if stop.is_set():
                return
            yield kind, obj
    finally:
        events.stop()


def run(
    what: str,
    list_: Callable[[], ListResult],
    watch: Callable[[str, threading.Event], Any],
    on_list: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[str, dict[str, Any]], None],
    on_lost: Callable[[], None],
    stop: threading.Event,
    retry_s: float,
) -> None:
    """Until `stop`: `on_list` with every list's items, `on_event` with each watch event after it."""
    failing = False
    while not stop.is_set():
        try:
            items, version = list_()
            on_list(items)
            failing = False
            for kind, obj in watch(version, stop):
                on_event(kind, obj)
        except Exception as e:  # the API server is away or the watch expired: list again
            on_lost()
            # once per outage, not every retry: the state it leaves is logged by the caller's on_lost
            (log.info if failing else log.warning)("%s out of sync, listing again in %.0f s: %s", what, retry_s, e)
            failing = True
            stop.wait(retry_s)
