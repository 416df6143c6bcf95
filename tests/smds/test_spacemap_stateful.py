"""The space map against a deliberately simple model, over long random histories.

The model is a dict of pages (in use by an allocation, or pending under a txid),
the pages each block has handed out since it was taken, and each queue's current
block. Allocation is predicted by walking the payload over the blocks, not by
the space map's arithmetic; every answer the map gives is checked against the
model, and the model's own invariants against the map's figures.
"""

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cqsd.smds import DataMap, DoubleFree, NoSpace, Range, SpaceMap, UnallocatedFree
from cqsd.smds.pages import PAGE, room

QUEUES = ["A", "B", ("TRAN", 7)]
MAX_BLOCKS = 14


class SpaceMapVersusModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.live: dict[int, list[Range]] = {}  # allocation handle -> its ranges
        self.pending: dict[int, tuple[int, list[Range]]] = {}  # handle -> (txid, ranges)
        self.pages: dict[int, str] = {}  # page -> "used" | "pending"
        self.handed: dict[int, set[int]] = {}  # block in use -> pages handed out since taken
        self.current: dict[object, int] = {}  # queue -> its current block
        self.handles = itertools.count(1)
        self.txids = itertools.count(1)

    @initialize(ppb=st.sampled_from([1, 2, 4, 9]), blocks=st.integers(2, 6))
    def start(self, ppb, blocks):
        self.ppb, self.blocks = ppb, blocks
        self.s = SpaceMap(ppb * PAGE, blocks * ppb * PAGE)

    # -- the model's own arithmetic -------------------------------------------------------

    def block_of(self, page):
        return page // self.ppb

    def free_blocks(self):
        return [b for b in range(1, self.blocks) if b not in self.handed]

    def cursor(self, block):
        return len(self.handed[block])  # a current block hands out pages in order from 0

    def blocks_wanted(self, queue, nbytes):
        """New blocks a payload needs: walk it over the current tail, then whole blocks."""
        if queue in self.current:
            tail_room = room(self.ppb - self.cursor(self.current[queue]))
            if nbytes <= tail_room:
                return 0
            nbytes -= tail_room
        wanted = 1
        while nbytes > room(self.ppb):
            nbytes -= room(self.ppb)
            wanted += 1
        return wanted

    # -- rules ---------------------------------------------------------------------------

    @rule(queue=st.sampled_from(QUEUES),
          nbytes=st.one_of(st.integers(0, 2 * PAGE), st.integers(0, 5 * 9 * PAGE)))
    def allocate(self, queue, nbytes):
        wanted = self.blocks_wanted(queue, nbytes)
        if wanted > len(self.free_blocks()):
            before = self.s.to_bytes(0)
            with pytest.raises(NoSpace):
                self.s.allocate(queue, nbytes)
            assert self.s.to_bytes(0) == before, "a refused allocation must change nothing"
            return
        fresh = self.free_blocks()[:wanted]  # the lowest free blocks, in order
        ranges = self.s.allocate(queue, nbytes)
        DataMap.of("IMS1", bytes(nbytes), ranges).check_within(self.ppb, self.blocks)
        blocks = [self.block_of(r.page) for r in ranges]
        if queue in self.current and wanted < len(ranges):
            cur = self.current[queue]
            assert ranges[0].page == cur * self.ppb + self.cursor(cur), "starts at the cursor"
            blocks = blocks[1:]
        assert blocks == fresh, "new blocks are the lowest free ones"
        for r in ranges:
            block = self.block_of(r.page)
            for page in range(r.page, r.page + r.pages):
                assert page not in self.pages, f"page {page} allocated twice"
                self.pages[page] = "used"
                self.handed.setdefault(block, set()).add(page)
        self.current.pop(queue, None)
        last = ranges[-1]
        if (last.page + last.pages) % self.ppb:
            self.current[queue] = self.block_of(last.page)
        self.live[next(self.handles)] = ranges

    @precondition(lambda self: self.live)
    @rule(data=st.data(), logged=st.booleans())
    def free(self, data, logged):
        handle = data.draw(st.sampled_from(sorted(self.live)))
        ranges = self.live.pop(handle)
        if logged:
            txid = next(self.txids)
            self.s.free(ranges, txid)
            self.pending[handle] = (txid, ranges)
            for r in ranges:
                self.pages.update(dict.fromkeys(range(r.page, r.page + r.pages), "pending"))
        else:
            self.s.free(ranges, None)
            self.forget(ranges)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def release(self, data):
        upto = data.draw(st.sampled_from(sorted(t for t, _ in self.pending.values())))
        due = [h for h, (t, _) in self.pending.items() if t <= upto]
        expected = sum(r.pages for h in due for r in self.pending[h][1])
        assert self.s.release(upto) == expected
        for handle in due:
            self.forget(self.pending.pop(handle)[1])

    def forget(self, ranges):
        """Pages become free; a block whose every handed-out page is free goes back."""
        for r in ranges:
            for page in range(r.page, r.page + r.pages):
                del self.pages[page]
        for block in {self.block_of(r.page) for r in ranges}:
            if not any(p in self.pages for p in self.handed[block]):
                del self.handed[block]
                self.current = {q: b for q, b in self.current.items() if b != block}

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def double_free_is_refused(self, data):
        handle = data.draw(st.sampled_from(sorted(self.pending)))
        before = self.s.to_bytes(0), self.s.usage()
        with pytest.raises(DoubleFree):
            self.s.free(self.pending[handle][1], data.draw(st.sampled_from([None, 10**6])))
        assert (self.s.to_bytes(0), self.s.usage()) == before

    @rule(data=st.data())
    def free_of_unallocated_pages_is_refused(self, data):
        unused = [p for p in range(self.ppb, self.blocks * self.ppb) if p not in self.pages]
        if not unused:
            return
        page = data.draw(st.sampled_from(unused))
        ranges = [Range(page, 1)] + data.draw(st.sampled_from([[], *self.live.values()]))
        before = self.s.usage()
        with pytest.raises(UnallocatedFree):
            self.s.free(ranges, None)
        assert self.s.usage() == before

    @precondition(lambda self: self.blocks < MAX_BLOCKS)
    @rule(more=st.integers(1, 4))
    def grow(self, more):
        more = min(more, MAX_BLOCKS - self.blocks)
        assert self.s.grow((self.blocks + more) * self.ppb * PAGE) == more
        self.blocks += more

    @rule(timestamp=st.integers(0, 2**64 - 1), rebuild=st.booleans())
    def restart(self, timestamp, rebuild):
        """A clean stop and start (the saved map) or a crash (the rebuild from data maps):
        pending pages come back as in use, current blocks are forgotten."""
        saved = self.s.to_bytes(timestamp)
        if rebuild:
            everything = [*self.live.values(), *(r for _, r in self.pending.values())]
            self.s = SpaceMap.rebuild(self.ppb * PAGE, self.blocks * self.ppb * PAGE,
                                      (r for ranges in everything for r in ranges))
        else:
            self.s, stamp = SpaceMap.from_bytes(saved + bytes(-len(saved) % PAGE),
                                                self.ppb * PAGE, self.blocks * self.ppb * PAGE)
            assert stamp == timestamp
        assert self.s.to_bytes(timestamp) == saved
        self.live.update({h: r for h, (_, r) in self.pending.items()})
        self.pending.clear()
        self.pages = dict.fromkeys(self.pages, "used")
        self.handed = {}
        for page in self.pages:
            self.handed.setdefault(self.block_of(page), set()).add(page)
        self.current.clear()

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def figures_match_the_model(self):
        u = self.s.usage()
        total = (self.blocks - 1) * self.ppb
        used = sum(1 for s in self.pages.values() if s == "used")
        pending = len(self.pages) - used
        tails = sum(self.ppb - self.cursor(b) for b in self.current.values())
        assert (u.total_pages, u.used_pages, u.pending_pages) == (total, used, pending)
        assert u.used_pages + u.free_pages + u.pending_pages == u.total_pages
        assert (u.blocks_in_use, u.free_blocks) == (len(self.handed), len(self.free_blocks()))
        assert u.available_pages == len(self.free_blocks()) * self.ppb + tails
        assert self.s.wants_growth == (100 * (total - u.available_pages) >= 90 * total)

    @invariant()
    def every_page_is_where_the_model_says(self):
        for page in range(self.ppb, self.blocks * self.ppb):
            assert self.s.page_state(page) == self.pages.get(page, "free"), page

    @invariant()
    def each_queue_continues_in_its_current_block(self):
        for queue in QUEUES:
            block = self.current.get(queue)
            expected = None if block is None else Range(
                block * self.ppb + self.cursor(block), self.ppb - self.cursor(block))
            assert self.s.current(queue) == expected


SpaceMapVersusModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_space_map_behaves_like_the_model = SpaceMapVersusModel.TestCase
