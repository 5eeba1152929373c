"""The official ``pulsar-client`` against a real ``pubsubd serve --pulsar-port 0``: a client
factory and a raw-protocol connection (our frame codec) for what the client does not expose."""

from __future__ import annotations

import socket
from typing import Any

import _pulsar
import pulsar

from pubsubd.pulsar import frames
from pubsubd.pulsar.api import BaseCommand, Type


def make_client(url: str, **kwargs: Any) -> pulsar.Client:
    """A client that gives up on an operation after 5 s and logs errors only."""
    kwargs.setdefault("operation_timeout_seconds", 5)
    kwargs.setdefault("logger", pulsar.ConsoleLogger(_pulsar.LoggerLevel.Error))
    return pulsar.Client(url, **kwargs)


class RawConnection:
    """One Pulsar connection spoken frame by frame."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.decoder = frames.FrameDecoder()
        self.pending: list[frames.Frame] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(self, cmd: Any) -> None:
        self.send(frames.encode_command(cmd.SerializeToString()))

    def read(self) -> tuple[Any, frames.Frame] | None:
        """The next command from the server; None when it closed the connection."""
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.pending += self.decoder.feed(data)
        frame = self.pending.pop(0)
        cmd = BaseCommand()
        cmd.ParseFromString(frame.command)
        return cmd, frame

    def connect(self) -> None:
        cmd = BaseCommand(type=Type.Value("CONNECT"))
        cmd.connect.client_version = "raw-test"
        cmd.connect.protocol_version = 20
        self.command(cmd)
        reply = self.read()
        assert reply is not None and reply[0].type == Type.Value("CONNECTED")

    def close(self) -> None:
        self.sock.close()
