"""HTTPS on a front's listener: the certificate and key, loaded into an SSL context that can be swapped.

Each new connection takes `TlsContext.context` as it is when it is accepted (trio.SSLStream), so
`reload()` (on SIGHUP, say) changes what new connections get and leaves open ones alone. This is the
one place a server's TLS context is built.
"""

from __future__ import annotations

import ssl

__all__ = ["TlsContext", "TlsError"]


class TlsError(Exception):
    """The certificate or key could not be loaded; the message names the files and why."""


class TlsContext:
    """A server's TLS certificate chain and private key (PEM files), as an ssl.SSLContext."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = self._load()

    def reload(self) -> None:
        """Read the files again; on an error (TlsError) the context in use stays."""
        self.context = self._load()

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # TLS 1.2 at least, the library's ciphers
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"cannot load TLS certificate {self.cert_file!r} with key {self.key_file!r}: "
                           f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}") from None
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx
