"""What a structure has done since it was made: the counters the monitoring
listener exports (``cqsd_puts_total`` and the like). A few integer additions
on the request paths; restore and replay do not count (they repeat history)."""


class Counts:
    __slots__ = ("deletes", "expiries", "puts", "reads", "redeliveries", "suspends")

    def __init__(self) -> None:
        self.puts = 0  # messages put, one by one or in a commit
        self.reads = 0  # messages read with a lock
        self.redeliveries = 0  # of those, read again after an earlier delivery
        self.deletes = 0  # messages deleted by their reader or the operator
        self.suspends = 0  # failed deliveries that sent a message to its suspend queue
        self.expiries = 0  # leased locks that expired unrenewed (failed deliveries)
