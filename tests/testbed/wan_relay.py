"""The WAN's latency: a transparent TCP relay that delays every byte.

tc netem does not exist on the machines the bed runs on, so the sites bed
(sites.py) gives its WAN a router namespace whose nftables rule redirects every
forwarded TCP connection to this relay.  The relay reads where the connection
was going (SO_ORIGINAL_DST), connects on from the router, and copies both ways,
each chunk released half the round-trip time after it arrived.  Each direction
is a queue with release times (a chunk never waits for the one before it to be
written plus its own delay, so a stream is delayed, not slowed) kept in byte
order; when a queue holds more than MAX_QUEUED bytes the relay stops reading
that side until it drains (TCP's own flow control then holds the sender).
Bandwidth is not the relay's: tc tbf on the router's links shapes it.

What it does not model: TCP's handshake (connect() returns at once; the first
request pays the round trip) and the window limits of a long fat pipe (each
side's TCP sees a near-zero RTT).  A destination that refuses or cannot be
reached resets the client's connection at once.

Standard library only; run as a program in the router namespace:
    python3 wan_relay.py PORT ONE_WAY_MS
It prints "ready" on stdout once it listens.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import sys

SO_ORIGINAL_DST = 80          # linux/netfilter_ipv4.h
CHUNK = 65536
MAX_QUEUED = 8 << 20          # bytes per direction (more than 100 ms at 600 Mbit/s)


class DelayedPipe:
    """One direction of a connection: chunks read from `src` are written to
    `dst` `delay` seconds after they were read, in order."""

    def __init__(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float):
        self.src, self.dst, self.delay = src, dst, delay
        self.loop = asyncio.get_running_loop()
        self.queue: collections.deque = collections.deque()   # (release time, bytes or None)
        self.queued = 0
        self.ready = asyncio.Event()      # the head of the queue may be released
        self.room = asyncio.Event()       # the queue has room for more
        self.room.set()

    async def run(self) -> None:
        writer = asyncio.ensure_future(self._write())
        try:
            await self._read()
            await writer
        finally:
            writer.cancel()

    async def _read(self) -> None:
        while True:
            await self.room.wait()
            data = await self.src.read(CHUNK)
            self._push(data or None)
            if not data:
                return

    def _push(self, data: bytes | None) -> None:
        release = self.loop.time() + self.delay
        self.queue.append((release, data))
        if data:
            self.queued += len(data)
            if self.queued > MAX_QUEUED:
                self.room.clear()
        if len(self.queue) == 1:
            self.loop.call_at(release, self.ready.set)

    async def _write(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            now = self.loop.time()
            while self.queue and self.queue[0][0] <= now:
                _, data = self.queue.popleft()
                if data is None:
                    if self.dst.can_write_eof():
                        self.dst.write_eof()
                    return
                self.dst.write(data)
                self.queued -= len(data)
            if self.queued <= MAX_QUEUED:
                self.room.set()
            await self.dst.drain()
            if self.queue:
                self.loop.call_at(self.queue[0][0], self.ready.set)


def original_destination(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, addr = struct.unpack("!2xH4s8x", raw)
    return socket.inet_ntoa(addr), port


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, as the far end would have answered."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.close()


async def relay(delay: float, own_port: int, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> None:
    try:
        host, port = original_destination(writer.get_extra_info("socket"))
        if port == own_port:        # not redirected: someone dialled the relay itself
            raise ConnectionRefusedError(host)
        far_reader, far_writer = await asyncio.open_connection(host, port)
    except OSError:
        reset(writer)
        return
    for w in (writer, far_writer):
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pipes = [DelayedPipe(reader, far_writer, delay), DelayedPipe(far_reader, writer, delay)]
    try:
        await asyncio.gather(*(p.run() for p in pipes))
    except (OSError, asyncio.IncompleteReadError):
        reset(writer)
        reset(far_writer)
        return
    for w in (writer, far_writer):
        w.close()


async def serve(port: int, delay: float) -> None:
    server = await asyncio.start_server(lambda r, w: relay(delay, port, r, w), "0.0.0.0", port,
                                        reuse_address=True, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: wan_relay.py PORT ONE_WAY_MS", file=sys.stderr)
        return 2
    asyncio.run(serve(int(argv[0]), float(argv[1]) / 1000.0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
