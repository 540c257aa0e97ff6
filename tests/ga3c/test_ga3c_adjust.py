"""Dynamic adjustment of (NA, NP, NT) (GA3C section 4.2), TPS-only and lag-aware, with a fake measurement and no
waiting."""

import itertools
import logging
import math

import pytest

from lightning_per.actors.adjust import Counts, DynamicAdjuster, Window


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

    def tps_of(self, counts):
        a, p, t = counts.as_tuple()
        return 1000.0 - 10 * abs(a - self.peak[0]) - 30 * abs(p - self.peak[1]) - 20 * abs(t - self.peak[2])

    def tps(self):
        return Window(self.tps_of(self.counts))


class LaggingSystem(FakeSystem):
    """TPS keeps rising with the agents (peak beyond the maxima) while the p95 policy lag grows with them and falls
    with the trainers: lag_p95 = 3 * agents - 2 * trainers (a simulated system)."""

    def __init__(self, start=(1, 1, 1)):
        super().__init__(start=start, peak=(16, 2, 4))

    @staticmethod
    def lag_of(counts):
        return 3.0 * counts.agents - 2.0 * counts.trainers

    def tps(self):
        return Window(self.tps_of(self.counts), self.lag_of(self.counts))


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
    values = iter([Window(100.0), Window(120.0), Window(90.0), None])
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
                                      (dict(warmup_s=-1.0), "warmup_s"), (dict(tolerance=1.0), "tolerance"),
                                      (dict(max_lag_p95=0.0), "max_lag_p95"), (dict(max_lag_p95=-2), "max_lag_p95")])
def test_bad_arguments(kw, name):
    fake = FakeSystem()
    args = dict(get_counts=fake.get, apply=fake.apply, measure=fake.tps, max_counts=Counts(2, 2, 2))
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        DynamicAdjuster(**args)


# ---- lag-aware: maximise TPS subject to p95 lag <= a bound ----------------------------------------------------

def _best_within(fake, bound, max_counts=(16, 4, 4)):
    """Brute force over the whole grid: the highest TPS among configurations whose lag is within the bound."""
    grid = [Counts(a, p, t) for a, p, t in itertools.product(*(range(1, m + 1) for m in max_counts))]
    return max((c for c in grid if fake.lag_of(c) <= bound), key=fake.tps_of)


def test_without_a_bound_tps_alone_drives_the_lag_up():
    fake = LaggingSystem()
    adj = make(fake)
    for _ in range(400):
        adj.step()
    assert fake.counts == Counts(16, 2, 4) and fake.lag_of(fake.counts) == 40.0  # the paper's rule: lag ignored


@pytest.mark.parametrize("bound", [10.0, 20.0])
def test_lag_aware_adjustment_finds_the_best_configuration_within_the_bound(bound):
    fake = LaggingSystem()
    adj = make(fake, max_lag_p95=bound)
    for _ in range(600):
        assert adj.step()
        assert fake.lag_of(fake.counts) <= bound  # after each window the kept configuration is within the bound
    assert fake.counts == _best_within(fake, bound)
    kept = [h for h in adj.history if h["kept"]]
    assert all(h["lag_p95"] <= bound for h in kept)
    assert all(b["tps"] >= a["tps"] for a, b in zip(kept, kept[1:]))  # within the bound, kept TPS never drops
    over = [h for h in adj.history if h["lag_p95"] > bound]
    assert over and not any(h["kept"] for h in over)  # configurations over the bound were tried and reverted


def test_a_start_over_the_bound_walks_back_within_it():
    fake = LaggingSystem(start=(12, 1, 1))  # lag 34
    adj = make(fake, max_lag_p95=10.0)
    for _ in range(600):
        adj.step()
    assert fake.lag_of(fake.counts) <= 10.0 and fake.counts == _best_within(fake, 10.0)
    lags = [h["lag_p95"] for h in adj.history if h["kept"]]
    first_within = next(i for i, lag in enumerate(lags) if lag <= 10.0)
    assert all(b <= a for a, b in zip(lags[:first_within], lags[1:first_within + 1]))  # only nearer the bound
    assert all(lag <= 10.0 for lag in lags[first_within:])  # and never out again


def test_each_decision_and_its_reason_is_logged(caplog):
    fake = LaggingSystem(start=(3, 1, 1))  # lag 7, within 8; one more agent: 10, over it
    adj = make(fake, max_lag_p95=8.0)
    with caplog.at_level(logging.INFO, logger="lightning_per.actors.adjust"):
        for _ in range(40):
            adj.step()
    lines = [r.getMessage() for r in caplog.records]
    assert any("reverted: p95 lag" in m and "over the bound 8" in m for m in lines)
    assert any("kept: TPS" in m and "<= 8" in m for m in lines)
    moved = [h for h in adj.history if h["reason"] not in ("first measurement", "no move: baseline refreshed")]
    assert len(lines) == len(moved) and all(h["reason"] for h in adj.history)


def test_a_window_without_lag_counts_as_within_the_bound():
    adj = DynamicAdjuster(lambda: Counts(1, 1, 1), lambda c: None, lambda: Window(1.0), Counts(2, 2, 2),
                          max_lag_p95=4.0)
    assert adj.within_bound(Window(5.0)) and math.isnan(Window(5.0).lag_p95)
    assert adj.decide(Window(5.0), Window(6.0, 9.0))[0]  # over the bound before, no lag measured now: kept
