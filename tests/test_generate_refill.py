"""A refill after a lowering is spread (generate/refill.py): the new batch does not start as one wave."""

from __future__ import annotations

from servefleet.generate.concurrency import ConcurrencyController
from servefleet.generate.refill import SPREAD, Refill


def test_a_refill_after_a_lowering_is_spread_over_part_of_a_lifetime() -> None:
    r = Refill()
    assert r.allows(0.0, 0, 564, 14.0)  # not armed: no pacing
    r.arm()
    assert r.allows(1.0, 600, 564, 14.0)  # still draining: the caller's limit decides, pacing has not begun
    assert not r.pacing
    spread = SPREAD * 14.0
    sent = 0
    while r.allows(2.0, sent, 564, 14.0):  # the first free slot: one goes at once, not 564
        r.sent_one()
        sent += 1
    assert sent == 1 and r.pacing
    while r.allows(2.0 + spread / 2, sent, 564, 14.0):  # half the spread: about half the batch
        r.sent_one()
        sent += 1
    assert 564 * 0.45 <= sent <= 564 * 0.55
    assert r.allows(2.0 + spread, sent, 564, 14.0) and not r.armed  # after the spread: free again


def test_a_lowering_arms_the_refill_and_a_raise_does_not() -> None:
    from servefleet.generate.dispatch import _Server
    from servefleet.generate.endpoints import Target
    from servefleet.generate.health import HealthPolicy

    s = _Server(Target("a", "http://127.0.0.1:1"), ConcurrencyController.auto(1024), HealthPolicy())
    s.limit_changed(0.0, grew=True)
    assert not s.refill.armed
    s.limit_changed(0.0, grew=False)
    assert s.refill.armed


def test_without_a_measured_lifetime_nothing_is_held_back() -> None:
    r = Refill()
    r.arm()
    assert r.allows(0.0, 0, 100, 0.0) and not r.armed
