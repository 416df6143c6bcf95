"""Runs the daemon with the first growth of a data set held until the test says go:
``python gated_growth.py FIFO python -m cqsd run ...`` (the harness's ``prefix``).

The growth's ``posix_fallocate`` (of an ``.smds`` file, past its start: not a
create) logs ``test_growth_held`` and then opens FIFO for reading, which blocks
until the test opens it for writing: an event the test controls, not a sleep,
so it can see what the daemon serves while a growth is under way and what a
put that needs it gets once it is done.
"""

import json
import os
import runpy
import sys


def main() -> None:
    fifo, command = sys.argv[1], sys.argv[2:]
    assert command[1:3] == ["-m", "cqsd"], command
    real = os.posix_fallocate
    held: list[int] = []

    def fallocate(fd: int, offset: int, length: int) -> None:
        if offset and not held and os.readlink(f"/proc/self/fd/{fd}").endswith(".smds"):
            held.append(fd)
            print(json.dumps({"event": "test_growth_held", "size": offset,
                              "new_size": offset + length}), file=sys.stderr, flush=True)
            with open(fifo, "rb") as gate:
                gate.read()
        real(fd, offset, length)

    os.posix_fallocate = fallocate
    sys.argv = ["cqsd", *command[3:]]
    runpy.run_module("cqsd", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
