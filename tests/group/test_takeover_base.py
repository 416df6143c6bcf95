"""A cold takeover does not read the whole history of a pair (docs/group.md,
"Checkpoints in a group"): a new owner counts the sealed series after the pair's
newest checkpoint as owed, and when a cold rebuild folded checkpoint_log_volume
bytes or more it saves the pair as its base image at once, so the next cold
takeover folds only what came after. Real etcd, real daemons, real SIGKILLs."""

import uuid

import cqsclient
from cqsd.storage import image

from .checker import QUEUE, STRUCTURE, owner_messages, reference_messages
from .cluster import Node, shared_data

LEASE = 3
# a checkpoint job would not finish in a second: the base image is what bounds the fold
KEYS = 'checkpoint_interval = 0\ncheckpoint_log_volume = "128KiB"\njob_timeout = 1'
PUTS = 300  # 1 KiB each: more than the volume
ONE = f'[[structure]]\nname = "{STRUCTURE}"\nsize = "16MiB"\n'  # a spread pair: never moved


def rebuilt(node, mark: int) -> dict:
    [done] = node.wait_for("structure_rebuilt", after=mark, structure=STRUCTURE, timeout=60)
    return done


def test_a_cold_takeover_saves_a_base_and_the_next_folds_only_what_came_after(etcd_server):
    """NODE1 logs 300 KiB and is killed: NODE2 folds all of it, then saves the pair as
    its base image covering the sealed series; NODE1, back as a cold standby, takes
    the pair over from that base, folding only the records NODE2 logged, and serves
    every acknowledged message, as the reference fold of the log has them."""
    data, group = shared_data(), "B" + uuid.uuid4().hex[:6].upper()
    first, second = (Node(name, data, etcd_server.endpoint, group=group, lease=LEASE,
                          daemon_keys=KEYS, structures=ONE) for name in ("NODE1", "NODE2"))
    try:
        first.start()
        first.wait_for("takeover_done", structure=STRUCTURE, timeout=60)
        second.start()
        with cqsclient.connect(first.address, client="B1", timeout=10) as c:
            for i in range(PUTS):
                c.structure(STRUCTURE).put(QUEUE, b"%04d" % i + bytes(1020))
        mark = second.mark()
        first.kill()
        cold = rebuilt(second, mark)
        assert cold["source"] == "empty" and cold["records_replayed"] >= PUTS, cold
        [saved] = second.wait_for("base_image_saved", after=mark, structure=STRUCTURE)
        assert saved["messages"] == PUTS, saved
        covered = image.read_header(data / "images" / f"{STRUCTURE}.base", STRUCTURE)["lsn"]
        assert any(w.startswith("NODE1-") and lsn >= PUTS for w, lsn in covered.items()), covered

        with cqsclient.connect(second.address, client="B2", timeout=10) as c:
            for i in range(10):
                c.structure(STRUCTURE).put(QUEUE, b"after%d" % i)
        first.start()
        mark = first.mark()
        second.kill()
        again = rebuilt(first, mark)
        assert again["source"] == "base" and again["records_replayed"] <= 12, again
        held = owner_messages(first.address)
        assert len(held) == PUTS + 10 and held == reference_messages(data)
    finally:
        for node in (first, second):
            node.cleanup()
