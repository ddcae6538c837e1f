"""When records waiting in Kafka call for an archive run: Secor's rule, per topic.

A run is due once `min_records` wait beyond the archived position, or once the oldest waiting
record has waited `max_delay`. The triggerer (`cairn_airflow.triggers.waiting_records`) feeds a
`Watch` each poll with the topic's last stable offsets, and with the archived position, read from
the consumer group each commit moves, whenever the watch asks for it (`needs_position`): at the
start, before any firing (a run may have committed meanwhile) and while a fired run has not
committed. An idle topic (no record beyond the position) therefore costs its share of one
offsets request per poll and nothing else. The watch never decides what a run reads: the run's
plan does, from its token. A firing too many only starts a run that finds nothing new.

The oldest record's wait is counted from when the watch first saw records beyond the position
(`since`), not from its Kafka timestamp, which a producer sets as it likes. A triggerer that
restarts starts that clock again: records waiting then fire within `max_delay` of its start.
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


@dataclass
class Watch:
    """One topic's state between polls, in one triggerer process."""

    rule: WaitRule
    position: Offsets | None = None
    since: float | None = None
    """When records were first seen beyond the position (monotonic seconds)."""
    fired_at: float | None = None
    fired_from: Offsets | None = field(default=None)
    """The position the last firing saw: the firing is answered once the position moves."""
    read_at: float | None = None
    """When the position was last read."""

    def needs_position(self, stable: Offsets, now: float) -> bool:
        """Whether the position must be read before `due` can answer: never read yet, a fired run
        not seen to commit yet (once per `max_delay`: what waits after its commit counts from
        the firing, so no firing can be due sooner), or a run looks due (its answer must not
        rest on a position a commit may have moved). A topic Kafka never held a record of needs
        none yet."""
        if self.position is None:
            return any(stable.values())
        if self.fired_at is not None:
            return now - (self.read_at or self.fired_at) >= self.rule.max_delay
        return self._due(stable, now)

    def saw_position(self, position: Offsets, now: float) -> None:
        """The consumer group's offsets, as just read at `now`."""
        self.read_at = now
        if self.fired_from is not None and position != self.fired_from:
            # The fired run committed: what waits now arrived after its plan, so after the firing.
            self.since = self.fired_at
            self.fired_at = self.fired_from = None
        self.position = dict(position)

    def due(self, stable: Offsets, now: float) -> bool:
        """Whether to fire now; remembers the firing when it answers True."""
        if not self._due(stable, now):
            return False
        self.fired_at, self.fired_from = now, dict(self.position or {})
        return True

    def _due(self, stable: Offsets, now: float) -> bool:
        position = self.position or {}
        waiting = waiting_records(stable, position)
        if waiting == 0 and not behind(stable, position):
            self.since = None
            return False
        if self.since is None:
            self.since = now
        if self.fired_at is not None and now - self.fired_at < self.rule.refire_after:
            return False  # its run has not committed yet
        return (
            waiting >= self.rule.min_records
            or now - self.since >= self.rule.max_delay
            or behind(stable, position)
        )
