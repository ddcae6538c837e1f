"""When records waiting in Kafka call for an archive run: Secor's rule, per topic.

A run is due once `min_records` wait beyond what is archived or already fired for, or once the
oldest of them has waited `max_delay`. The triggerer (`cairn_airflow.triggers.waiting_records`)
feeds a `Watch` each poll with the topic's last stable offsets, and with the archived position,
read from the consumer group each commit moves, whenever the watch asks for it
(`needs_position`): at the start, before any firing (a run may have committed meanwhile), at
once when a commit in the same process moved the group, and, while fired runs have not been
seen to commit, only when a move could change what happens: more records wait than the firings
cover while those firings already wait on the position (`AHEAD`), after `max_delay`, then twice
as long each time the group had not moved, up to `REREAD_CAP`; or their run looks lost
(`refire_after`). A run queued behind hundreds takes minutes: 1,000 topics each read every
`max_delay` cost the triggerer a third of its time, and every `REREAD_CAP` still a sixth. An
idle topic (no record beyond the position) therefore costs its share of one offsets request per
poll and nothing else. The watch never decides what a run reads: the run's plan does, from its
token. A firing too many only starts a run that finds nothing new.

A firing covers the records stable when it fired: its run plans later, so it reads at least
those. Records that arrive after it fire the next run by the same rule, even before the first
commits: Airflow queues that run behind the running one (`max_active_runs: 1`), so a topic whose
records keep coming runs back to back instead of waiting for each commit to be seen. While the
position stands still, no more than `AHEAD` firings are pending.

The oldest record's wait is counted from when the watch first saw records beyond the position
and the last firing (`since`), not from its Kafka timestamp, which a producer sets as it likes. A
triggerer that restarts starts that clock again: records waiting then fire within `max_delay` of
its start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Offsets = dict[int, int]
"""Per Kafka partition, an offset."""


@dataclass(frozen=True)
class WaitRule:
    """One topic's rule: how many waiting records, or how long a wait, starts a run."""

    min_records: int
    max_delay: float
    """Seconds."""

    @property
    def refire_after(self) -> float:
        """Seconds after a firing whose run has not moved the position before firing again: the
        run may have failed, or its event been lost with a triggerer. Long, as a run waiting
        for a Spark slot in a burst is no lost one, and a second firing only queues a run that
        finds nothing new (a 100-topic burst whose runs waited 5 to 20 minutes queued one for
        every topic at 5 minutes)."""
        return max(3 * self.max_delay, 1800.0)


def waiting_records(stable: Offsets, position: Offsets) -> int:
    """Records beyond the archived position; a partition without one (new, or never archived)
    counts from offset 0."""
    return sum(max(0, end - position.get(p, 0)) for p, end in stable.items())


def behind(stable: Offsets, position: Offsets) -> bool:
    """The archived position is past Kafka's end: the topic was recreated or truncated, which
    only a run can sort out (and report)."""
    return any(position.get(p, 0) > end for p, end in stable.items())


REREAD_CAP = 120.0
"""Seconds: the longest a fired run's commit made elsewhere (a worker, another triggerer) goes
unseen. The run queued behind it (`AHEAD`) starts without the watch meanwhile."""

AHEAD = 2
"""Firings a topic may have pending while its position does not move: the running run's, and
one queued behind it (Airflow keeps it until the running run ends), so a topic whose records keep
arriving runs back to back, and one whose runs fail runs no more than two before `refire_after`."""


@dataclass
class Watch:
    """One topic's state between polls, in one triggerer process."""

    rule: WaitRule
    position: Offsets | None = None
    read_at: float | None = None
    """When the position was last read."""
    covered: Offsets = field(default_factory=dict)
    """Kafka's stable offsets at the last firing, while the position has not reached them: the
    fired run (or the one queued behind it) reads at least that far."""
    since: float | None = None
    """When records were first seen beyond the position and `covered` (monotonic seconds)."""
    fired_at: float | None = None
    fired_since_move: int = 0
    """Firings since the position last moved."""
    still_reads: int = 0
    """Reads since the last firing or move that found the position where it was."""

    def needs_position(self, stable: Offsets, now: float, moved: bool = False) -> bool:
        """Whether the position must be read before `due` can answer: never read yet, a fired run
        not seen to commit (`moved`: a commit in this process moved the group since the last
        read; else after `reread_after` if records wait that only a move lets fire), or a run
        looks due (its answer must not rest on a position a commit may have moved). A topic
        Kafka never held a record of needs none yet."""
        if self.position is None:
            return any(stable.values())
        if self._pending():
            if moved:
                return True
            last = max(self.read_at or 0.0, self.fired_at or 0.0)
            gone = behind(stable, self.position)
            freed_by_a_move = (gone or self._waiting(stable) > 0) and self._held(gone)
            if freed_by_a_move and now - last >= self.reread_after:
                return True
        return self._due(stable, now)

    @property
    def reread_after(self) -> float:
        """Seconds from the last read or firing to the next read while firings wait on the
        position: `max_delay`, doubled by each read that found it still, up to `REREAD_CAP`."""
        cap = max(self.rule.max_delay, REREAD_CAP)
        return min(self.rule.max_delay * 2 ** min(self.still_reads, 16), cap)

    def saw_position(self, position: Offsets, now: float) -> None:
        """The consumer group's offsets, as just read at `now`."""
        self.read_at = now
        if self.position == position:
            self.still_reads += 1
        if self.position is not None and position != self.position:
            self.fired_since_move = self.still_reads = 0
            if any(position.get(p, 0) < end for p, end in self.position.items()):
                self.covered = {}  # rewound by hand: no firing covers what is read again
        self.position = dict(position)
        if not self._pending():
            self.covered = {}

    def due(self, stable: Offsets, now: float) -> bool:
        """Whether to fire now; remembers the firing when it answers True."""
        if not self._due(stable, now):
            return False
        self.fired_at, self.covered = now, dict(stable)
        self.fired_since_move += 1
        self.still_reads = 0
        self.since = None
        return True

    def _pending(self) -> bool:
        position = self.position or {}
        return any(end > position.get(p, 0) for p, end in self.covered.items())

    def _due(self, stable: Offsets, now: float) -> bool:
        position = self.position or {}
        lost = self.fired_at is not None and now - self.fired_at >= self.rule.refire_after
        if lost and self._pending():  # its run failed, or its event was lost with a triggerer
            self.covered, self.fired_since_move, self.since = {}, 0, self.fired_at
        waiting = self._waiting(stable)
        gone = behind(stable, position)
        if waiting == 0 and not gone:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        if self._held(gone) and not lost:
            return False  # the position has not moved since this topic's last firings
        return waiting >= self.rule.min_records or now - self.since >= self.rule.max_delay or gone

    def _waiting(self, stable: Offsets) -> int:
        """Records beyond both the position and what the firings cover."""
        position = self.position or {}
        base = {p: max(position.get(p, 0), self.covered.get(p, 0)) for p in stable}
        return waiting_records(stable, base)

    def _held(self, gone: bool) -> bool:
        """This topic's firings wait for the position to move: `AHEAD` of them, or one for a
        topic whose position is past Kafka's end (one run reports a recreated topic)."""
        ahead = 1 if gone else AHEAD
        return self.fired_since_move >= ahead and (gone or self._pending())
