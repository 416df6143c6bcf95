"""The daemon: the only part of cqsd that awaits (STYLE §1). It moves bytes
between sockets and the pure engine, and turns engine events into notifications."""
