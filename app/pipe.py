"""The pipe between the server and a worker process (app/worker.py, app/worker_process.py): its
framing, and the test-only faults a worker acts on. Both ends import this; neither imports the other
for it.

Messages are pickled with the plain pickler, so tensors travel as bytes instead of shared-memory
handles (which need file-descriptor passing). Only the server and its own spawned workers write
to the pipe: no client bytes are ever unpickled.
"""

from __future__ import annotations

import pickle

# Test-only faults (NMT_FAULT_INJECTION=true): a source containing one of these words makes the
# worker raise, exit abruptly, or stall for FAULT_SLOW_S (app/worker_process.py).
FAULT_RAISE, FAULT_EXIT, FAULT_SLOW = "boomboom", "crashcrash", "sleepsleep"
FAULT_SLOW_S = 4.0  # how long FAULT_SLOW holds its worker: well past the tests' request deadline


def send_message(conn, message) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive_message(conn):
    return pickle.loads(conn.recv_bytes())
