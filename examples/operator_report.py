"""An operator's script: what is queued, who holds what, and the dead letters.

    CQSD_ADDRESS=unix://./cqsd-data/cqsd.sock python examples/operator_report.py [--requeue]

Prints each queue of MSGQ01 with its depth, the messages clients hold locked,
and the suspended messages (delivered ``max_deliveries`` times without
success) with the queue each came from; with ``--requeue``, once the fault
is fixed, puts each back on its queue with a fresh delivery count.
"""

import os
import sys

import cqsclient


def main(*args: str) -> None:
    with cqsclient.connect(client=os.environ.get("CQSD_CLIENT", "OPERATOR")) as c:
        s = c.structure("MSGQ01")
        for row in s.query("queues"):
            print(f"queue {row['qtype']}:{row['queue']} depth {row['depth']} "
                  f"locked {row['locked']}")
        for lock in s.query("locks"):
            print(f"locked {lock['entry_id']} on {lock['qtype']}:{lock['queue']} "
                  f"by {lock['owner']}")
        for m in s.browse_all():
            if m.qtype != "TRAN_SUSPEND" or m.home is None:
                continue
            print(f"suspended {m.entry_id} from {':'.join(m.home)} after "
                  f"{m.delivery_count} deliveries: {m.data[:40]!r}")
            if "--requeue" in args:
                where = s.requeue(m.entry_id)
                print(f"requeued {m.entry_id} to {where.qtype}:{where.queue}")


if __name__ == "__main__":
    main(*sys.argv[1:])
