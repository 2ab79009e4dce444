"""The webhook's TLS server context, made anew when its certificate or key file changes (cert rotation)."""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_Identity = tuple[tuple[int, int, int, int], ...]


class TlsError(RuntimeError):
    """The certificate and key cannot be loaded."""


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])  # the API server offers h2 too: tell it we speak only HTTP/1.1
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the TLS certificate {cert} and key {key}: {e}") from e
    return context


class ReloadingContext:
    """`current()` is the context of the files as they are now. The files are looked at on every call (a stat
    each: cheap next to a handshake); after a change they are loaded again. A pair that does not load (a writer
    that replaced the certificate but not the key yet) leaves the last good context in use until the files change
    again. A Secret volume swaps both files at once (its `..data` link): stat follows the link to the new files."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        try:  # TlsError at start: a webhook without its certificate is no use
            self._loaded = self._identity()
        except OSError as e:
            raise TlsError(f"cannot load the TLS certificate {cert} and key {key}: {e}") from e
        self._context = server_context(cert, key)
        self._refused: _Identity | None = None

    def _identity(self) -> _Identity:
        stats = [os.stat(p) for p in (self.cert, self.key)]
        return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def current(self) -> ssl.SSLContext:
        try:
            identity = self._identity()
        except OSError as e:  # mid-swap, or gone: serve with what we have
            log.debug("cannot stat the TLS files: %s", e)
            return self._context
        with self._lock:
            if identity in (self._loaded, self._refused):
                return self._context
            try:
                context = server_context(self.cert, self.key)
            except TlsError as e:
                log.warning("%s; still serving the previous certificate", e)
                self._refused = identity
                return self._context
            self._context, self._loaded, self._refused = context, identity, None
            log.info("reloaded the TLS certificate %s", self.cert)
            return context
