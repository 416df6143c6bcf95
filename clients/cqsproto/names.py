"""The client-name rule: which names ``register`` accepts (docs/protocol.md).

One rule for everyone who checks a name — the daemon at ``register``, the
config's ``[[client]]`` table, cqsctl's ``--client`` — so that a name one of
them accepts is never refused by another.
"""

import re
from typing import Final

__all__ = ["CLIENT_NAME", "CLIENT_NAME_RULE"]

# An IMS ID is 1-8 of A-Z 0-9 @ # $; cqsd allows more, because its clients are
# also ordinary programs named by people (lower case, dots, dashes, 16 long).
CLIENT_NAME: Final = re.compile(r"[A-Za-z0-9@#$_.-]{1,16}")
CLIENT_NAME_RULE: Final = "1 to 16 of A-Z a-z 0-9 @ # $ _ . -"
