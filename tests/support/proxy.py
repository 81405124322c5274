"""A loopback TCP proxy the test controls: a network partition between one process and a
server without touching the server. :meth:`Proxy.cut` drops every connection through it
and refuses new ones; :meth:`Proxy.heal` lets them through again."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class Proxy:
    """Forwards connections to ``127.0.0.1:<target>`` from its own loopback port."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = True
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Drop every connection (both ends) and refuse new ones until :meth:`heal`."""
        with self._lock:
            self._open = False
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def heal(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = not self._open
            if refuse:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            with self._lock:
                self._sockets.discard(sock)


@contextlib.contextmanager
def proxy_to(target: int) -> Iterator[Proxy]:
    """A :class:`Proxy` to ``target``, closed on exit."""
    proxy = Proxy(target)
    try:
        yield proxy
    finally:
        proxy.close()
