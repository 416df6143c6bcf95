"""The reference fold and the Spark fold behind one interface, for the contract tests.

Both take start images ``{structure: {id: row}}`` and ``(writer, lsn, timestamp,
body)`` records in any order, and return the folded rows per structure. Both
materialise offloaded payloads, as the Spark jobs do.
"""

import copy

import msgpack
import pyarrow as pa

from cqsd.recovery import fold as reference
from cqsd.srds import effects
from cqsd.srds import fold as spark_fold_module


def log_order(record: tuple) -> tuple:
    writer, lsn, ts, _ = record
    return (ts, writer, lsn)


def python_fold(spark, images: dict, records: list, structures: list[str]) -> dict:
    bodies = [body for *_, body in sorted(records, key=log_order)]
    folded = {}
    for s in structures:
        rows = copy.deepcopy(images.get(s, {}))
        reference.fold(rows, bodies, s, materialise=True)
        folded[s] = rows
    return folded


def spark_fold(spark, images: dict, records: list, structures: list[str]) -> dict:
    batches = list(effects.batches(records, set(structures)))
    base = [_base_row(s, row) for s, rows in images.items() for row in rows.values()]
    if base:
        batches.append(effects.batch(base))
    events = (spark.createDataFrame(pa.Table.from_batches(batches)) if batches
              else spark.createDataFrame([], spark_fold_module.EVENTS))
    with spark_fold_module.raised():
        table = spark_fold_module.fold(events).toArrow()
    folded: dict = {s: {} for s in structures}
    for r in table.to_pylist():
        home = [r["home_qtype"], r["home_name"]] if r["home_qtype"] is not None else None
        datamap = msgpack.unpackb(r["map"]) if r["map"] is not None else None
        lease = [r["lease"], r["deadline"]] if r["lease"] is not None else None
        folded[r["structure"]][r["id"]] = [r["id"], r["qtype"], r["name"], r["data"], True,
                                           r["put_time"], r["count"], r["where"], r["owner"],
                                           home, datamap, lease, r["not_before"]]
    return folded


def _base_row(structure: str, row: list) -> tuple:
    eid, qtype, name, data, _, put_time, count, where, owner, home, datamap, lease, later = row
    return (structure, eid, -1, "", 0, 0, 0, effects.BASE, qtype, name, data, put_time, count,
            where, owner, *(home or (None, None)), None,
            msgpack.packb(datamap) if datamap is not None else None,
            *(lease or (None, None)), later, None)
