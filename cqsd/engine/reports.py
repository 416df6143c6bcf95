"""What the engine reports to operators: rows of figures by name, as the
protocol's query replies and ``cqsctl display`` carry them."""

from typing import Any

Row = dict[str, Any]
