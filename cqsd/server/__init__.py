"""The daemon: the only part of cqsd that awaits (docs/architecture.md, "The
rules"). It moves bytes between sockets and the pure engine, and turns engine
events into notifications."""
