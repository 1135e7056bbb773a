"""Clients that leave or stop reading, noticed the same way by every front end with a connection
(`serve`, `uds`, `stdio`; a Lambda invocation has none).

- `ClientLeft`: raised where a request notices its client is gone (a `gone()` check between
  tokens, or a write that cannot finish); the generation behind it is closed at that token, so
  the engine is free, and the transport drops the connection.
- `socket_gone(sock, half_close=True)`: a poll that does not wait. Gone: the peer closed or reset
  (POLLHUP/POLLERR), the socket reads EOF, or, with `half_close`, the peer shut its sending side
  (POLLRDHUP). TCP cannot tell a shut sending side from a close, so HTTP counts it; a unix socket
  can (a close is POLLHUP), so `uds` lets a client shut its side after its last request.
- `pipe_gone(fd)`: the reader of a pipe we write to closed it (stdio's stdout).
- `StallBudget`: the seconds the writes of one answer may block in total. A per-write timeout
  lets a client that reads one byte now and then hold the engine without end.
- `small_send_buffer(sock)`: a stream's kernel send buffer of STREAM_SNDBUF bytes, so a client that
  stops reading blocks our writes after tens of KB rather than megabytes (what its own kernel
  still accepts, its receive buffer, comes on top and is not ours to set).
"""

from __future__ import annotations

import time

STREAM_SNDBUF = 32 * 1024  # Linux doubles it for bookkeeping: ~64 KB in flight at most
# select and socket are imported where used: the handler imports this module and has no socket.


class ClientLeft(Exception):
    """The client of this request is gone, or stopped reading for longer than allowed."""


def _revents(fd, events: int) -> int:
    import select

    p = select.poll()  # poll: no fd-number limit, unlike select
    p.register(fd, events)
    got = p.poll(0)
    return got[0][1] if got else 0


def socket_gone(sock, half_close: bool = True) -> bool:
    import select
    import socket

    rdhup = getattr(select, "POLLRDHUP", 0)  # Linux
    try:
        ev = _revents(sock, select.POLLIN | rdhup)
        if not ev:
            return False
        if ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return True
        if half_close and ev & rdhup:
            return True
        # readable: EOF, or the next request already sent (pipelined), which is not a hang-up
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"" and half_close
    except BlockingIOError:
        return False
    except OSError:
        return True


def pipe_gone(fd: int) -> bool:
    import select

    try:
        return bool(_revents(fd, select.POLLOUT) & (select.POLLERR | select.POLLHUP | select.POLLNVAL))
    except (OSError, ValueError):
        return True


def small_send_buffer(sock) -> None:
    import socket

    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
    except OSError:
        pass  # not a socket we can tune: the stall budget still bounds the wait


class StallBudget:
    """`write(send, data)` calls send(data) with the socket's timeout set to what is left of
    `seconds`; `send(data)` writes to a socket the caller made non-blocking, waiting only when
    the kernel's buffer is full (a stream's tokens: one syscall each). The time each write
    waited is spent; ClientLeft once it is used up."""

    def __init__(self, sock, seconds: float):
        self.sock, self.seconds, self.left = sock, seconds, seconds

    def write(self, send, data: bytes) -> None:
        if self.left <= 0:
            raise ClientLeft(f"the client read too little for {self.seconds:g} s")
        self.sock.settimeout(self.left)
        t0 = time.monotonic()
        try:
            send(data)
        except TimeoutError:
            raise ClientLeft(f"the client read too little for {self.seconds:g} s") from None
        finally:
            self.left -= time.monotonic() - t0

    def send(self, data: bytes) -> None:
        """All of `data` on a non-blocking socket: one send() when the kernel takes it, a poll for
        room only when it does not (a socket with a timeout polls before every send, and each
        syscall hands the GIL to another of the 64 streams' threads)."""
        import select

        view = memoryview(data)
        while True:
            try:
                n = self.sock.send(view)
            except BlockingIOError:
                n = 0
            if n == len(view):
                return
            view = view[n:]
            if self.left <= 0:
                raise ClientLeft(f"the client read too little for {self.seconds:g} s")
            t0 = time.monotonic()
            p = select.poll()
            p.register(self.sock, select.POLLOUT)
            got = p.poll(self.left * 1000)
            self.left -= time.monotonic() - t0
            if not got:
                raise ClientLeft(f"the client read too little for {self.seconds:g} s")
