"""The framing of our own sockets: between the server and its worker processes (app/worker.py,
app/worker_process.py), and between HTTP processes and the engine process (app/engine.py); and the
test-only faults a worker acts on. Every end imports this; none imports another for it.

A message is a pickle, sent as its length (8 bytes, big-endian) and then its bytes. The server's
ends read and write on the event loop (asyncio streams: no thread hops between a worker's answer
and the request it completes); a worker process, which does one thing at a time, uses a plain
blocking socket. Messages are pickled with the plain pickler, so tensors travel as bytes instead of
shared-memory handles (which need file-descriptor passing). Only our own processes write to these
sockets: no client bytes are ever unpickled.
"""

from __future__ import annotations

import asyncio
import pickle
import select
import socket
import struct

# Test-only faults (NMT_FAULT_INJECTION=true): a source containing one of these words makes the
# worker raise, exit abruptly, or stall for FAULT_SLOW_S (app/worker_process.py).
FAULT_RAISE, FAULT_EXIT, FAULT_SLOW = "boomboom", "crashcrash", "sleepsleep"
FAULT_SLOW_S = 4.0  # how long FAULT_SLOW holds its worker: well past the tests' request deadline

LENGTH = struct.Struct("!Q")


def _frame(message) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(body)) + body


# --- the event loop's end --------------------------------------------------------------------------

def write_message(writer: asyncio.StreamWriter, message) -> None:
    """Queue one message; the transport sends it as the socket takes it (await writer.drain() to wait)."""
    writer.write(_frame(message))


async def read_message(reader: asyncio.StreamReader):
    """The next message; asyncio.IncompleteReadError (an EOFError) when the other end closed."""
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    return pickle.loads(await reader.readexactly(length))


# --- a worker process's end (blocking) -------------------------------------------------------------

def send(sock: socket.socket, message) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) < 1 << 16:
        sock.sendall(LENGTH.pack(len(body)) + body)
    else:  # a long result (attention weights): not copied once more to prepend its length
        sock.sendall(LENGTH.pack(len(body)))
        sock.sendall(body)


def receive(sock: socket.socket):
    """The next message; EOFError when the server's end closed."""
    (length,) = LENGTH.unpack(_exactly(sock, LENGTH.size))
    return pickle.loads(_exactly(sock, length))


def waiting(sock: socket.socket) -> bool:
    """Whether a message (or EOF) is there to receive without blocking."""
    return bool(select.select([sock], [], [], 0)[0])


def _exactly(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError(f"the socket closed {got} bytes into a {size}-byte read")
        got += n
    return data
