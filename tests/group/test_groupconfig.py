"""The [group] table and the prefer lists: every key accepted and checked."""

import pytest

from cqsd.config import ConfigError, loads

BASE = """
[daemon]
data_dir = "/tmp/cqsd-group-config"
{daemon}
[[structure]]
name = "MSGQ01"
size = "1MiB"
overflow = "MSGQ01OV"
{prefer}
[[structure]]
name = "MSGQ01OV"
size = "1MiB"
{ov}
"""


def config(group="", prefer="", daemon="", ov=""):
    return loads(BASE.format(prefer=prefer, daemon=daemon, ov=ov) + group)


GROUP = '[group]\nname = "CQSG1"\nnode = "NODE1"\netcd = ["http://127.0.0.1:2379"]\n'


def test_a_group_takes_its_defaults():
    """Only name, node and etcd are needed; lease 5 s, warm standby, a 120 s window."""
    g = config(GROUP).group
    assert (g.name, g.node, g.etcd) == ("CQSG1", "NODE1", ("http://127.0.0.1:2379",))
    assert (g.lease, g.standby, g.dedup_window) == (5, "warm", 120)
    assert g.advertise == "unix:///tmp/cqsd-group-config/cqsd.sock"


def test_advertise_defaults_to_the_tcp_listener():
    """With a TCP listener, clients of the group are told its address."""
    c = config(GROUP, daemon='tcp = "127.0.0.1:7410"\n'
               '[[client]]\nname = "A"\nsecret_sha256 = "' + "0" * 64 + '"')
    assert c.group.advertise == "tcp://127.0.0.1:7410"


def test_without_a_group_there_is_none():
    """A daemon on its own has no group, as before."""
    assert config().group is None


def test_prefer_is_kept_in_order():
    """A preference list names nodes in the order they are wanted."""
    c = config(GROUP, prefer='prefer = ["NODE2", "NODE1"]')
    assert c.structure("MSGQ01").prefer == ("NODE2", "NODE1")
    assert c.structure("MSGQ01OV").prefer is None


@pytest.mark.parametrize(("group", "prefer", "ov", "problem"), [
    ("", 'prefer = ["NODE1"]', "", "structure[0].prefer: means nothing without a [group]"),
    (GROUP, "", 'prefer = ["NODE1"]', "structure[1].prefer: means nothing on MSGQ01OV"),
    (GROUP, "prefer = []", "", "structure[0].prefer: is empty"),
    (GROUP, 'prefer = ["N1", "N1"]', "", "names a node twice"),
    (GROUP, 'prefer = ["node1"]', "", 'did you mean "NODE1"'),
    (GROUP + "lease = 1\n", "", "", "group.lease: must be between 2 and 3600"),
    (GROUP + 'standby = "hot"\n', "", "", "group.standby: expected one of warm, cold"),
    (GROUP + 'advertise = "7410"\n', "", "", "group.advertise:"),
    (GROUP + "dedup_window = -1\n", "", "", "group.dedup_window:"),
    (GROUP + "colour = 1\n", "", "", "group.colour: unknown key"),
    (GROUP.replace("http://127.0.0.1:2379", "127.0.0.1:2379"), "", "", "group.etcd:"),
    (GROUP.replace('["http://127.0.0.1:2379"]', "[]"), "", "", "group.etcd: needs at least"),
    (GROUP.replace('node = "NODE1"\n', ""), "", "", "group.node: required key is missing"),
])
def test_a_bad_group_is_refused_naming_the_key(group, prefer, ov, problem):
    """Each mistake in [group] or prefer is named by its key path."""
    with pytest.raises(ConfigError) as err:
        config(group, prefer, ov=ov)
    assert problem in str(err.value)


def test_a_group_that_is_not_a_table_is_refused():
    """``group = 3`` is named as what it is."""
    with pytest.raises(ConfigError, match="group: expected a table"):
        loads("group = 3\n" + BASE.format(prefer="", daemon="", ov=""))
