"""One Spark session for the whole test session: starting a JVM costs seconds."""

import pytest


@pytest.fixture(scope="session")
def spark():
    from cqsd.srds import session

    s = session.start("local[2]", {"spark.sql.shuffle.partitions": "2",
                                   "spark.default.parallelism": "2"}, app="cqsd-srds-tests")
    yield s
    s.stop()
