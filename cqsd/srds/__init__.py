"""Structure Recovery Data Sets: checkpoints of a structure's recoverable messages.

Each structure has two slots, ``SRDS1`` and ``SRDS2`` (Parquet directories), and
a manifest saying which one is current (docs/srds.md). A checkpoint folds the
current slot with the log after it into the other slot and then swaps the
manifest; recovery folds the newest valid slot with every record after it.

``slots`` and ``manifest`` are what the daemon imports: they use pyarrow and
never start a JVM. The jobs (``python -m cqsd.srds``) run the fold on Spark
(``fold``, ``segments``, ``effects``, ``entryfold``, ``parts``, ``jobs``, ``session``).
"""
