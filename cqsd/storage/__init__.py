"""What cqsd keeps on disk besides the logstream: structure images and the data directory."""
