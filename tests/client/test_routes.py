"""The SDK's map of owners (cqsclient.routes): pure bookkeeping, no daemon."""

from __future__ import annotations

from cqsclient.routes import Routes

A, B = "tcp://a:1", "tcp://b:1"


def test_a_structure_goes_home_until_its_owner_is_known():
    """Unknown structures, and requests naming none, go to the home."""
    routes = Routes(A)
    assert routes.address("S1") == A and routes.address("") == A
    routes.redirect("S1", B)
    assert routes.address("S1") == B and routes.owners() == {"S1": B}


def test_a_moved_structure_registers_its_interests_at_its_first_answer():
    """A NOT_OWNER moving a known structure leaves it unsettled: the fast path does
    not take it, and its first answer at the new owner says it moved."""
    routes = Routes(A)
    assert routes.served("S1", A) is False  # first seen: nothing to restore
    assert routes.knows("S1", A)
    routes.redirect("S1", B)
    assert not routes.knows("S1", B)
    assert routes.served("S1", B) is True
    assert routes.knows("S1", B) and routes.served("S1", B) is False


def test_a_followed_structure_is_settled_only_where_its_interests_were_registered():
    """Following a NOT_OWNER: registered at the target, the structure is settled
    there; refused there (a move's target not serving it yet), it stays unsettled."""
    routes = Routes(A)
    routes.served("S1", A)
    routes.followed("S1", B, registered=False)
    assert routes.address("S1") == B and not routes.knows("S1", B)
    routes.followed("S1", A, registered=True)
    assert routes.knows("S1", A)


def test_a_lost_link_forgets_only_its_structures():
    """The structures of the lost node go home again, and say they moved when
    they answer; the others keep their owner."""
    routes = Routes(A)
    routes.served("S1", A)
    routes.served("S2", B)
    assert routes.lost(B) == {"S2"}
    assert routes.owners() == {"S1": A} and routes.address("S2") == A
    assert routes.served("S2", A) is True


def test_settling_moves_the_home_and_retires_links_whose_pairs_left():
    """A home serving nothing moves to a link that serves something; a link that
    served pairs and serves none now is retired; the way-in node is kept until it
    has served something."""
    routes = Routes(A)
    routes.redirect("S1", B)
    assert routes.settle([A, B]) == [] and routes.home == B  # A, the way in, stays
    routes.served("S2", A)
    routes.redirect("S2", B)
    assert routes.settle([A, B]) == [A] and routes.home == B
    routes.reset(A)
    assert routes.owners() == {} and routes.home == A and routes.settle([A]) == []
