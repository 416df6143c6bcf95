"""The harness itself: what a test reads of a daemon's log is everything the
daemon wrote before the test looked."""

import socket
import sys

from .harness import Daemon

# Stands in for the daemon: says ready, waits to be told, logs a burst of lines
# in one write (less than a pipe holds), then at once tells the test over the
# socket that it has written them: as a daemon logs an event, then replies.
BURST = r"""
import json, os, socket, sys
print(json.dumps({"event": "ready"}), file=sys.stderr, flush=True)
told = socket.socket(socket.AF_UNIX)
told.connect(sys.argv[1])
for round in range(int(sys.argv[2])):
    told.recv(1)
    os.write(2, b"".join(b'{"event": "burst", "round": %d}\n' % round for _ in range(1000)))
    told.sendall(b"x")
"""
ROUNDS = 50


def test_a_look_sees_every_line_written_before_it():
    d = Daemon()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(d.socket)
    listener.listen(1)
    # the daemon's own arguments follow, unread
    d.prefix = [sys.executable, "-c", BURST, d.socket, str(ROUNDS)]
    try:
        d.start()
        conn, _ = listener.accept()
        for round in range(ROUNDS):
            conn.sendall(b"g")
            assert conn.recv(1) == b"x"
            assert len(d.events("burst", round=round)) == 1000
            assert d.mark() == 1 + 1000 * (round + 1)
        conn.close()
        d.proc.wait(10)
    finally:
        listener.close()
        d.cleanup()
