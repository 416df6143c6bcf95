"""A request that must wait for something before it can run, and is run again
whole once it is there (dispatch.py).

Design note. A put that finds no room in its data set while the data set can
grow waits for the growth, which runs in a worker thread (docs/smds.md,
"Expansion"); every other client is served meanwhile. Rather than a handler
that awaits half-way through, the request is refused internally *before it
has changed anything* (``RunAgain``), and dispatched again from the start once
``ready`` is set: the checks and the outcome are those of any request, and
nothing half-done waits across the loop's turns. The connection reads none of
its later requests meanwhile, so its replies and effects keep request order
(docs/protocol.md).
"""

import trio


class RunAgain(Exception):
    """Raised by a handler, before it has changed anything, when its request can
    run only once ``ready`` is set."""

    def __init__(self, ready: trio.Event, why: str) -> None:
        super().__init__(why)
        self.ready = ready
