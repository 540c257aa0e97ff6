"""Dynamic adjustment of (NA, NP, NT) (GA3C section 4.2) with a fake TPS signal and no waiting."""

import pytest

from lightning_per.ga3c.adjust import Counts, DynamicAdjuster


class FakeSystem:
    """Counts plus a TPS surface peaked at (8, 2, 3); records every apply()."""

    def __init__(self, start=(1, 1, 1), peak=(8, 2, 3)):
        self.counts = Counts(*start)
        self.peak = peak
        self.applied = []

    def get(self):
        return self.counts

    def apply(self, c):
        self.applied.append(c)
        self.counts = c

    def tps(self):
        a, p, t = self.counts.as_tuple()
        return 1000.0 - 10 * abs(a - self.peak[0]) - 30 * abs(p - self.peak[1]) - 20 * abs(t - self.peak[2])


def make(fake, max_counts=(16, 4, 4), measure=None, **kw):
    return DynamicAdjuster(fake.get, fake.apply, measure or fake.tps, Counts(*max_counts), warmup_s=0.0,
                           wait=lambda s: True, seed=1, **kw)


def test_climbs_to_the_best_configuration():
    fake = FakeSystem()
    adj = make(fake)
    for _ in range(400):
        assert adj.step()
    assert fake.counts.as_tuple() == fake.peak
    kept = [h for h in adj.history if h["kept"]]
    assert all(b["tps"] >= a["tps"] for a, b in zip(kept, kept[1:]))  # kept TPS never drops


def test_reverts_a_change_that_lowers_tps():
    fake = FakeSystem(start=(8, 2, 3))  # already optimal: every move is worse
    adj = make(fake)
    for _ in range(30):
        adj.step()
        assert fake.counts == Counts(8, 2, 3)  # after each window the best is back
    reverted = [h for h in adj.history if not h["kept"]]
    assert reverted, "some moves must have been tried and reverted"
    # every reverted move was followed by an apply() of the previous counts
    assert Counts(8, 2, 3) in fake.applied


def test_bounds_are_respected():
    fake = FakeSystem(start=(1, 1, 1), peak=(0, 0, 0))  # pulls below 1
    adj = make(fake, max_counts=(3, 2, 2))
    for _ in range(200):
        adj.step()
        a, p, t = fake.counts.as_tuple()
        assert 1 <= a <= 3 and 1 <= p <= 2 and 1 <= t <= 2
    fake = FakeSystem(start=(3, 2, 2), peak=(99, 99, 99))  # pulls above the maxima
    adj = make(fake, max_counts=(3, 2, 2))
    for _ in range(200):
        adj.step()
        assert fake.counts == Counts(3, 2, 2)


def test_stops_when_signal_says_so():
    fake = FakeSystem()
    values = iter([100.0, 120.0, 90.0, None])
    adj = make(fake, measure=lambda: next(values))
    adj.run()  # returns once measure() gives None (the run is stopping)
    assert [h["tps"] for h in adj.history] == [100.0, 120.0, 90.0][: len(adj.history)]
    assert len(adj.history) == 3


def test_run_ends_when_wait_fails():
    fake = FakeSystem()
    adj = DynamicAdjuster(fake.get, fake.apply, fake.tps, Counts(4, 4, 4), warmup_s=5, wait=lambda s: False)
    adj.run()
    assert adj.history == [] and fake.applied == []


@pytest.mark.parametrize("kw, name", [(dict(max_counts=Counts(0, 1, 1)), "max_counts"),
                                      (dict(warmup_s=-1.0), "warmup_s"), (dict(tolerance=1.0), "tolerance")])
def test_bad_arguments(kw, name):
    fake = FakeSystem()
    args = dict(get_counts=fake.get, apply=fake.apply, measure=fake.tps, max_counts=Counts(2, 2, 2))
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        DynamicAdjuster(**args)
