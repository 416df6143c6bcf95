"""What the live-daemon fuzzer draws: the daemon's configurations (small limits,
so that every limit is cheap to reach, and one with payloads past the log's
record limit), and the names, keys, sizes and entry choices of its requests."""

import re
from dataclasses import dataclass

from hypothesis import strategies as st

from .fuzz_checks import MAX_BATCH

KiB, MiB = 1024, 1024 * 1024

CLIENT_NAME = re.compile(r"[A-Za-z0-9@#$_.-]{1,16}")  # docs/protocol.md
CLIENTS = ["A", "B", "C", "D"]
MAX_CLIENTS = 4  # the checker and three fuzzing clients: CLIENT_LIMIT is reachable
MAX_PEERS = 6
MAX_WAIT = 30
CAPACITY = {"STRUCTURE_FULL", "OVERFLOW_REJECTED", "SMDS_FULL"}
KINDS = ["structures", "queues", "clients", "locks", "headers", "backups"]


@dataclass(frozen=True)
class Shape:
    """A daemon configuration: its limits and the sizes of its structures."""

    max_message: int
    msgq: int  # MSGQ01 SIZE
    initsize: int  # below SIZE, so overflow processing first grows it
    entry_max: int  # MSGQ01 and MSGQ01OV: the same, so a message costs the same in either
    ov: int
    threshold: int  # MSGQ01's overflow threshold (percent)
    offload: bool = False  # MSGQ01 offloads payloads over entry_max to small data sets

    def smds(self) -> str:
        """MSGQ01's SMDS keys: only payloads over entry_max offloaded (the fill rules
        off, so the model knows which), data sets small enough to expand and fill."""
        if not self.offload:
            return ""
        return ('offload = "smds"\ndsblock = "64KiB"\ndssize = "512KiB"\ndsmax = "2MiB"\n'
                "offld1thr = 100\noffld2thr = 100\noffld3thr = 100\n")

    def toml(self, grace: float, max_deliveries: int) -> tuple[str, str]:
        keys = (f'max_message = {self.max_message}\nmax_clients = {MAX_CLIENTS}\n'
                f'max_connections = 64\nresync_grace = {grace}\n'
                f'max_deliveries = {max_deliveries}\nhandshake_timeout = 600\nsend_queue = 64\n'
                f'max_wait = {MAX_WAIT}\nspark_master = "local[1]"\n')
        structures = (f'[[structure]]\nname = "MSGQ01"\nsize = {self.msgq}\n'
                      f'initsize = {self.initsize}\nentry_max = {self.entry_max}\n'
                      f'overflow = "MSGQ01OV"\noverflow_threshold = {self.threshold}\n'
                      f'{self.smds()}\n'
                      f'[[structure]]\nname = "MSGQ01OV"\nsize = {self.ov}\n'
                      f'entry_max = {self.entry_max}\n\n'
                      f'[[structure]]\nname = "SMALL"\nsize = "8KiB"\nentry_max = "1KiB"\n')
        return keys, structures


SHAPES = {
    # a low threshold, so overflow processing starts early
    "small": Shape(64 * KiB, 512 * KiB, 256 * KiB, 4 * KiB, 256 * KiB, 30),
    # a frame limit (max_message + 1 MiB) above MAX_COMMIT_OPS small operations, and
    # below what MSGQ01 holds, so replies can outgrow it
    "wide": Shape(1536 * KiB, 8 * MiB, 6 * MiB, 4 * KiB, 2 * MiB, 70),
    # recoverable payloads past the log's 16 MiB record limit
    "big": Shape(100 * MiB, 48 * MiB, 24 * MiB, 32 * KiB, 40 * MiB, 70),
    # offloaded payloads through every request, SMDS_FULL reachable; overflow off, so
    # every MSGQ01 message is in the primary and the model knows its cost
    "smds": Shape(1536 * KiB, 512 * KiB, 256 * KiB, 4 * KiB, 256 * KiB, 100, offload=True),
}

# -- strategies ----------------------------------------------------------------------

picks = st.integers(0, 11)
structures = st.sampled_from(["MSGQ01", "SMALL", "MSGQ01", "SMALL", "MSGQ01OV", "NOPE"])
operator_structures = st.sampled_from(["MSGQ01", "SMALL", "MSGQ01OV", "NOPE"])
good_qtypes = ["TRAN", "TRAN_SERIAL", "LTERM", "TRAN_SUSPEND", 1, 4, "USER2"]
qtypes = st.sampled_from(good_qtypes * 3 + ["TRAN_STAGING", 2, 6, 0, 12, "tran", ""])
good_queues = ["A", "B", "Q23456789ABCDEF"]
queues = st.sampled_from(good_queues * 3 + ["", "Q23456789ABCDEFG", "é", "a\nb"])
keys = st.tuples(qtypes, queues)
good_keys = st.tuples(st.sampled_from(good_qtypes), st.sampled_from(good_queues))
SIZE_MARKS = ["entry_max", "entry_max2", "struct", "max_message", "frame", "half_log", "log",
              "20MiB"]
marks = st.tuples(st.sampled_from(SIZE_MARKS), st.integers(-2, 2))  # near a limit
sizes = st.one_of(st.integers(0, 700), st.integers(0, 5000), marks, marks)
# which entry: a message the model holds, one deleted before, or an id never handed out
BAD_IDS = [0, -1, 1, 2**63 - 1, 2**64 - 1, -(2**63)]
eids = st.tuples(st.sampled_from(["held"] * 4 + ["gone", "bad"]), st.integers(0, 63))
waits = st.sampled_from([None, None, 0, 0.01, -1, MAX_WAIT + 1, float("nan"), float("inf")])
# Leases and delays: absent, valid ones the model need not follow (a lease longer than
# any run, a delay of 0 or a not_before already past: an ordinary put), and every kind
# of nonsense, which must be INVALID_REQUEST (ABSENT: the field is not sent).
ABSENT = "absent"
MAX_LEASE = 12 * 3600.0
LONG_LEASE = 3600.0
BAD_SECONDS = [-1, -0.0001, float("nan"), float("inf"), float("-inf"), 1e300, 2**63 - 1,
               -(2**63)]
leases = st.sampled_from([ABSENT, ABSENT, ABSENT, None, LONG_LEASE, MAX_LEASE, 0,
                          MAX_LEASE + 1, *BAD_SECONDS])
delays = st.sampled_from([(ABSENT, ABSENT)] * 4 + [
    (0, ABSENT), (None, None), (ABSENT, 1.0), (ABSENT, 0), (1, 1.0), (400 * 86400, ABSENT),
    *[(bad, ABSENT) for bad in BAD_SECONDS], *[(ABSENT, bad) for bad in BAD_SECONDS]])


def lease_valid(lease) -> bool:
    return lease in (ABSENT, None) or (
        type(lease) in (int, float) and 0 < lease <= MAX_LEASE)


def delay_valid(delay, not_before) -> bool:
    """Whether a put's delay fields are accepted (as no delay at all: the model's puts
    are all ready at once)."""
    given = [v for v in (delay, not_before) if v not in (ABSENT, None)]
    if len(given) > 1:
        return False
    return delay in (ABSENT, None, 0) and not_before in (ABSENT, None, 0, 1.0)


def with_timing(fields: dict, **timing) -> dict:
    return {**fields, **{k: v for k, v in timing.items() if v is not ABSENT}}


counts = st.sampled_from([1, 1, 2, 5, 100, 0, -1, MAX_BATCH, MAX_BATCH + 1])
# a delete's next: none, a read (all fields, or the queue alone), or a map no read is
next_reads = st.one_of(
    st.none(), st.none(),
    st.tuples(st.just("read"), keys, counts),
    st.tuples(st.just("queue"), st.sampled_from(good_queues)),
    st.tuples(st.just("bad"), st.sampled_from([
        "A", 1, [], {}, {"queue": "A", "wait": 1}, {"queue": 5}, {"queue": "A", "n": "1"},
        {"queue": "A", "n": True}, {"queue": "A", "qtype": None},
        {"queue": "A", "lease": -1}, {"queue": "A", "lease": float("nan")}])),
)
commit_ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, sizes, st.booleans()),
    st.tuples(st.just("delete"), eids),
    st.tuples(st.just("move"), eids, keys),
    st.tuples(st.just("unlock"), eids, st.booleans(), st.one_of(st.none(), keys)),
), max_size=6)
