"""A minimal SMTP server on a raw socket whose test can make it do what real MTAs do to idle
clients: say `421 4.4.2 … timeout exceeded` and close (Postfix, Exim, Sendmail)."""

from __future__ import annotations

import socket
import threading


class IdleTimeoutSmtp:
    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port = self.server.getsockname()[1]
        self.received = 0
        self.connections = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.server.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(conn)
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            conn.sendall(b"220 mx.example ESMTP\r\n")
            while line := reader.readline():
                command = line[:4].upper()
                if command in (b"EHLO", b"HELO"):
                    conn.sendall(b"250-mx.example\r\n250 8BITMIME\r\n")
                elif command == b"DATA":
                    conn.sendall(b"354 go ahead\r\n")
                    while reader.readline() not in (b".\r\n", b""):
                        pass
                    with self._lock:
                        self.received += 1
                    conn.sendall(b"250 2.0.0 queued\r\n")
                elif command == b"QUIT":
                    conn.sendall(b"221 bye\r\n")
                    break
                else:
                    conn.sendall(b"250 2.1.0 ok\r\n")
        except OSError:
            pass
        finally:
            reader.close()
            conn.close()

    def time_out_idle_clients(self) -> None:
        """What an MTA does after its idle timeout: a 421, then the connection closes."""
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            try:
                conn.sendall(b"421 4.4.2 mx.example Error: timeout exceeded\r\n")
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.time_out_idle_clients()
        self.server.close()


class RecordingSmtp:
    """An SMTP server on a raw socket that offers `AUTH PLAIN` on a plain connection and no
    STARTTLS — what a careless server does, or any server once an attacker on the path has
    stripped STARTTLS from its EHLO — and records every byte each client sends, so a test can
    show what crossed the wire in the clear. `host` may be a non-loopback address of this
    machine. Accepts every command; `connected` is set once a client has said EHLO. `replies`
    replaces the answer to a command (b"EHLO", or b"." for the end of a message's data) with
    raw bytes: an endless multi-line reply, say."""

    def __init__(self, host: str = "127.0.0.1", replies: dict[bytes, bytes] | None = None) -> None:
        self.replies = replies or {}
        self.server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.server.bind((host, 0))
        self.server.listen()
        self.host = host
        self.port = self.server.getsockname()[1]
        self.received = 0
        self._transcript = bytearray()
        self._lock = threading.Lock()
        self.connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def transcript(self) -> bytes:
        with self._lock:
            return bytes(self._transcript)

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _heard(self, line: bytes) -> None:
        with self._lock:
            self._transcript += line

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            conn.sendall(b"220 mx.example ESMTP\r\n")
            while line := reader.readline():
                self._heard(line)
                command = line[:4].upper()
                if command in (b"EHLO", b"HELO"):
                    self.connected.set()
                    conn.sendall(
                        self.replies.get(b"EHLO")
                        or b"250-mx.example\r\n250-AUTH PLAIN\r\n250 8BITMIME\r\n"
                    )
                elif command == b"AUTH":
                    conn.sendall(b"235 2.7.0 authenticated\r\n")
                elif command == b"DATA":
                    conn.sendall(b"354 go ahead\r\n")
                    while (content := reader.readline()) not in (b".\r\n", b""):
                        self._heard(content)
                    with self._lock:
                        self.received += 1
                    conn.sendall(self.replies.get(b".") or b"250 2.0.0 queued\r\n")
                elif command == b"QUIT":
                    conn.sendall(b"221 bye\r\n")
                    break
                else:
                    conn.sendall(b"250 2.1.0 ok\r\n")
        except OSError:
            pass  # the client hung up, possibly in the middle of an endless reply
        finally:
            reader.close()
            conn.close()

    def close(self) -> None:
        self.server.close()
