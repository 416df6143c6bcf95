"""The daemon's side of the shared message data sets (docs/smds.md): the data
path (datasets.py), and the rooms it is made of: the data sets' states
(availability.py), the open ones and their restart processing (opened.py,
restart.py), their space (space.py), their fdatasyncs (syncs.py), alter-smds
overrides and buffer pools (tuning.py), the displays (displays.py), the
operator commands (commands.py) and media recovery (mediarecovery.py). The
pure tables, formats and file I/O are cqsd/smds's."""
