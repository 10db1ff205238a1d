"""`gpuq bridge`: this process's stdin and stdout relayed to the local daemon's socket.

A head daemon reaches another server's daemon as ``ssh HOST gpuq bridge``
(DESIGN.md section 1): OpenSSH carries the bytes, this relay hands them to
the daemon's Unix socket unchanged, so the protocol, its handshake and its
version check are the same as for a local client, and no TCP port is ever
opened. The socket is found and checked as `gpuq.client` finds it (this
user's runtime directory, a listener of this user's), and the daemon is
started first if none runs.

Two directions, one thread each: stdin to the socket (its end half-closes
the socket, so the daemon answers what it was sent and then closes), and
the socket to stdout, which ends the relay when the daemon closes or stdout
goes away (the ssh session ended).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

CHUNK = 64 * 1024
"""Bytes read at a time from either side."""


def relay(sock: socket.socket, source: int, sink: int) -> None:
    """Copy `source` (a file descriptor) to `sock` and `sock` to `sink` until the socket closes.

    Returns when the daemon has closed its side, or when `sink` can no
    longer be written (the reader went away); the socket is closed then.
    """
    sock.settimeout(None)  # a stream may be silent between heartbeats; the daemon bounds that
    upstream = threading.Thread(target=_upstream, args=(source, sock), daemon=True)
    upstream.start()
    try:
        while chunk := sock.recv(CHUNK):
            _write_all(sink, chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the reader or the daemon went away: nothing left to relay
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def _upstream(source: int, sock: socket.socket) -> None:
    """Copy `source` to `sock`; at its end, half-close the socket so the daemon sees EOF."""
    try:
        while chunk := os.read(source, CHUNK):
            sock.sendall(chunk)
    except OSError:
        pass  # the socket closed under us: the other direction ends the relay
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
