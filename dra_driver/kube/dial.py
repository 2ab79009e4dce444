"""A TCP connection within a deadline: the name lookup, then each of its addresses tried with the time left.

getaddrinfo cannot be interrupted and takes as long as the resolver's timeouts and retries say, so a name (an IP
address needs no lookup) is looked up in a worker thread that the caller waits for only until its deadline. Callers
that need the same name while a lookup is under way wait for that one: a hung resolver holds one thread per name,
not one per request.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

AddrInfo = tuple[Any, ...]  # what socket.getaddrinfo returns a list of


def remaining(deadline: float) -> float:
    """Seconds left before `deadline` (a time.monotonic() value); TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _Lookup:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: list[AddrInfo] = []
        self.error: BaseException | None = None


_lookups: dict[tuple[str, int], _Lookup] = {}
_lock = threading.Lock()


def _look_up(key: tuple[str, int], lookup: _Lookup) -> None:
    try:
        lookup.result = socket.getaddrinfo(*key, type=socket.SOCK_STREAM)
    except BaseException as e:  # handed to the waiting callers
        lookup.error = e
    finally:
        with _lock:
            del _lookups[key]
        lookup.done.set()


def resolve(host: str, port: int, deadline: float) -> list[AddrInfo]:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    key = (host, port)
    with _lock:
        lookup = _lookups.get(key)
        if lookup is None:
            lookup = _lookups[key] = _Lookup()
            threading.Thread(target=_look_up, args=(key, lookup), name=f"getaddrinfo {host}", daemon=True).start()
    if not lookup.done.wait(remaining(deadline)):
        raise TimeoutError(f"timed out looking up {host}")
    if lookup.error is not None:
        raise lookup.error
    return lookup.result


def open_tcp(host: str, port: int, deadline: float) -> socket.socket:
    """A connected socket, TCP_NODELAY set (a request goes out in one write anyway)."""
    error: OSError = OSError(f"{host}: no address to connect to")
    for family, kind, proto, _, address in resolve(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(remaining(deadline))
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except TimeoutError:  # the deadline is spent: no time for the other addresses
            sock.close()
            raise
        except OSError as e:
            sock.close()
            error = e
    raise error
