"""Faults for the test suite: lazyfs (loses what was not fsynced) and a partition proxy."""
