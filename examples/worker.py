"""A worker: every message of a queue handled, deleted when done, failed on an error.

    CQSD_ADDRESS=unix://./cqsd-data/cqsd.sock python examples/worker.py [QUEUE]

A message whose handling raises goes back as a failed delivery (after the
daemon's ``max_deliveries`` it lands on the suspend queue, where
``examples/operator_report.py`` finds it). The worker carries on across
daemon restarts (``reconnect=True``) and stops cleanly on SIGTERM or Ctrl-C: the
message in hand is finished, those read ahead are given back.
"""

import logging
import os
import signal
import sys

import cqsclient


def handle(data: bytes) -> None:
    """The application's work: here, print the message; one saying "fail" fails."""
    if b"fail" in data:
        raise ValueError(f"cannot handle {data!r}")
    print(data.decode(), flush=True)


def main(queue: str = "TRANX") -> None:
    client = os.environ.get("CQSD_CLIENT", "WORKER1")
    with cqsclient.connect(client=client, reconnect=True) as c:
        messages = c.structure("MSGQ01").consume(queue)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: messages.stop())
        for m in messages:
            try:
                with m:  # deleted on success, a failed delivery on an exception
                    handle(m.data)
            except Exception:
                logging.exception("message %d failed", m.entry_id)


if __name__ == "__main__":
    main(*sys.argv[1:])
