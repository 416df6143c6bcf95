"""Restart churn: crash-restart time of a daemon SIGKILLed every second or so.

    .venv/bin/python benchmarks/restart_churn.py [--cycles 60] [--up 1.0] [--clients 2]
        [--volume 2MiB] [--segment 1MiB] [--depth 1000]

A structure holds --depth messages; --clients threads put and delete 100-byte
recoverable messages on it (a queue in steady state, every request a log
record) while the daemon runs; it is SIGKILLed --up seconds after it is ready
and started again. One JSON line per cycle: records the restart replayed, the
seconds from exec to its ready line, and the checkpoint and restart-image events
of the run; then a summary. With checkpoint_log_volume = --volume, what a
restart replays should stay around the volume's worth of records, not grow with
the cycle count.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cqsclient
from cqsclient.errors import CQSError

SHOWN = ("checkpoint_due", "checkpoint_started", "checkpoint_taken", "checkpoint_failed",
         "base_image_due", "base_image_saved", "log_trimmed")


def start(config: Path) -> tuple[subprocess.Popen, list[dict], float]:
    """Start the daemon; its process, its log so far (kept growing), and the seconds
    from exec to its ready line."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cqsd", "run", "--config", str(config)],
                            stderr=subprocess.PIPE, text=True)
    lines: list[dict] = []
    for line in proc.stderr:
        lines.append(json.loads(line))
        if lines[-1]["event"] == "ready":
            ready = time.monotonic() - began
            threading.Thread(target=lambda: lines.extend(map(json.loads, proc.stderr)),
                             daemon=True).start()
            return proc, lines, ready
    raise RuntimeError(f"the daemon did not start: {lines[-3:]}")


def churn(address: str, name: str, stop: threading.Event) -> None:
    """Put and delete until ``stop``, reconnecting while the daemon is down."""
    while not stop.is_set():
        try:
            with cqsclient.connect(address, client=name, timeout=5) as c:
                s = c.structure("MSGQ01")
                while not stop.is_set():
                    s.put("Q", b"x" * 100)
                    m = s.read("Q")
                    if m is not None:
                        s.delete(m.entry_id)
        except (CQSError, OSError):
            time.sleep(0.01)  # the daemon is down: try again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--up", type=float, default=1.0, help="seconds up before the kill")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--volume", default="2MiB", help="checkpoint_log_volume")
    parser.add_argument("--segment", default="1MiB", help="log_segment")
    parser.add_argument("--depth", type=int, default=1000, help="messages kept on the queue")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="churn"))
    config = root / "cqsd.toml"
    address = f"unix://{root / 's'}"
    config.write_text(
        f'[daemon]\ndata_dir = "{root / "data"}"\nsocket = "{root / "s"}"\n'
        f'spark_master = "local[2]"\ncheckpoint_interval = 0\n'
        f'checkpoint_log_volume = "{args.volume}"\nlog_segment = "{args.segment}"\n'
        '[[structure]]\nname = "MSGQ01"\nsize = "256MiB"\n')
    proc, lines, _ = start(config)
    with cqsclient.connect(address, client="FILL") as c:
        s = c.structure("MSGQ01")
        for i in range(0, args.depth, 500):
            s.put_batch("Q", [b"d" * 100] * min(500, args.depth - i))
    replayed = []
    for cycle in range(args.cycles):
        stop = threading.Event()
        workers = [threading.Thread(target=churn, args=(address, f"W{i}", stop))
                   for i in range(args.clients)]
        for w in workers:
            w.start()
        time.sleep(args.up)  # the moment of the crash, not a synchronisation
        proc.kill()
        proc.wait()
        stop.set()
        for w in workers:
            w.join()
        shown = [e["event"] for e in lines if e["event"] in SHOWN]
        proc, lines, ready = start(config)
        (rebuilt,) = [e for e in lines if e["event"] == "structure_rebuilt"]
        replayed.append(rebuilt["records_replayed"])
        print(json.dumps({"cycle": cycle, "replayed": rebuilt["records_replayed"],
                          "ready_s": round(ready, 2), "replay_s": rebuilt["replay_seconds"],
                          "run_events": shown}), flush=True)
    proc.kill()
    proc.wait()
    third = max(1, len(replayed) // 3)
    print(json.dumps({"summary": True, "max_replayed_first_third": max(replayed[:third]),
                      "max_replayed_last_third": max(replayed[-third:])}))


if __name__ == "__main__":
    main()
