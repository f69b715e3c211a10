"""app/pipe.py: a worker's blocking end and the event loop's end of one socket pair read each
other's messages whole, however long, and a socket that closes mid-message is an EOFError at
either end."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from app.pipe import LENGTH, read_message, receive, send, waiting, write_message

# 3 MiB: many times what an asyncio stream buffers before it pauses reading (64 KiB)
LONG = {"weights": bytes(range(256)) * (3 * 4096 + 7), "text": "Öffnen Sie die Datei."}


def test_both_ends_carry_short_and_long_messages_whole():
    async def main():
        server, worker = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=server)

        def worker_side():  # echoes what it receives, as a worker answers jobs
            while (message := receive(worker)) is not None:
                send(worker, ("echo", message))

        thread = threading.Thread(target=worker_side)
        thread.start()
        try:
            for message in [("job", 1, [[5, 6, 7]]), LONG, ("job", 2, list(range(100_000)))]:
                write_message(writer, message)
                await writer.drain()
                assert await read_message(reader) == ("echo", message)
            write_message(writer, None)
        finally:
            await asyncio.to_thread(thread.join, 10)
            writer.close()
            worker.close()
        assert not thread.is_alive()

    asyncio.run(main())


def test_waiting_says_whether_a_message_is_there():
    a, b = socket.socketpair()
    with a, b:
        assert not waiting(b)
        send(a, ("cancel", 3))
        assert waiting(b)
        assert receive(b) == ("cancel", 3)
        assert not waiting(b)
        a.close()
        assert waiting(b)  # EOF is there to read, without blocking
        with pytest.raises(EOFError):
            receive(b)


def test_a_socket_closed_mid_message_is_an_eof_at_either_end():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(LENGTH.pack(1000) + b"x" * 10)  # 10 bytes of a 1000-byte message, then gone
        a.close()
        with pytest.raises(EOFError, match="10 bytes into a 1000-byte read"):
            receive(b)

    async def main():
        server, worker = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=server)
        worker.sendall(LENGTH.pack(1000) + b"x" * 10)
        worker.close()
        with pytest.raises(EOFError):  # asyncio.IncompleteReadError is one
            await read_message(reader)
        writer.close()

    asyncio.run(main())
