"""A producer with units of work: each order goes to the daemon all or nothing.

    CQSD_ADDRESS=unix://./cqsd-data/cqsd.sock python examples/producer.py ORDER:ITEM,ITEM...

Each order is one unit of work: a message per item on the TRANX queue for the
workers, and a summary on the LTERM queue AUDIT. The daemon applies the unit as
one atomic commit, logged as one record: a worker never sees half an order, and
a crash never leaves an order without its audit line. Prints each order's
entry ids.
"""

import os
import sys

import cqsclient


def main(*orders: str) -> None:
    with cqsclient.connect(client=os.environ.get("CQSD_CLIENT", "PRODUCER1")) as c:
        s = c.structure("MSGQ01")
        for order in orders:
            name, _, items = order.partition(":")
            lines = [item for item in items.split(",") if item]
            with s.unit_of_work() as uow:  # one commit on leaving; nothing on an error
                for item in lines:
                    uow.put("TRANX", f"{name} {item}".encode())
                uow.put("AUDIT", f"{name}: {len(lines)} items".encode(), qtype="LTERM")
            print(name, *uow.entry_ids, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
