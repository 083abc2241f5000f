"""How big each mode is: smoke (seconds, for the test suite), quick (CI, <= 3 min), full."""

from __future__ import annotations

from dataclasses import dataclass, field

ALL_SYSTEMS = ("queen", "queen_sql", "queen3", "raw", "pgmq", "pgqueuer", "pgboss", "rabbitmq")
PEERS = ("pgmq", "pgqueuer", "pgboss", "rabbitmq")


@dataclass(frozen=True)
class Profile:
    name: str
    warmup: float  # seconds before the window opens
    duration: float  # seconds of measurement per case
    push_batches: tuple[int, ...] = (1, 10, 100, 1000)
    e2e_batches: tuple[int, ...] = (1, 10, 100)
    partitions: tuple[int, ...] = (1, 16, 1000)
    peer_push_batches: tuple[int, ...] = (1, 10, 100, 1000)
    peer_e2e_batches: tuple[int, ...] = (1, 10, 100)
    push_producers: int = 8
    e2e_producers: int = 4
    e2e_consumers: int = 8
    processes: int = 2  # driver processes per case (Python systems)
    latency_duration: float = 5.0
    backlog_sizes: tuple[int, ...] = (10_000, 10_000_000)
    backlog_partitions: int = 100
    memory_backlog: int = 1_000_000
    systems: tuple[str, ...] = ALL_SYSTEMS
    latency_systems: tuple[str, ...] = ("queen", "queen_sql", "raw", "pgmq", "rabbitmq")
    pop_wait_ms: int = 1000  # long-poll timeout of Queen consumers
    fanout_batch: int = 100  # push, pop and ack batch of the fan-out cases
    fanout_partitions: int = 16
    fanout_producers: int = 4
    fanout_consumers: int = 2  # per consumer group (or copy queue)
    # The small phase: batches of 1 and 10 with enough concurrent clients for requests of
    # one worker to overlap (what request fusion shares), spread over several processes.
    small_batches: tuple[int, ...] = (1, 10)
    small_partitions: int = 16
    small_producers: int = 32
    small_consumers: int = 32
    small_push_producers: int = 64
    small_processes: int = 4
    small_systems: tuple[str, ...] | None = None  # None: every system of the run
    notes: list[str] = field(default_factory=list)


FULL = Profile(name="full", warmup=2.0, duration=10.0, latency_duration=10.0)

QUICK = Profile(
    name="quick",
    warmup=0.5,
    duration=2.0,
    peer_push_batches=(100,),
    peer_e2e_batches=(100,),
    latency_duration=2.0,
    backlog_sizes=(10_000, 300_000),
    memory_backlog=100_000,
    small_systems=("queen", "raw", "pgmq"),
)

SMOKE = Profile(
    name="smoke",
    warmup=0.2,
    duration=0.6,
    push_batches=(100,),
    e2e_batches=(10,),
    partitions=(4,),
    peer_push_batches=(100,),
    peer_e2e_batches=(10,),
    push_producers=2,
    e2e_producers=2,
    e2e_consumers=2,
    processes=1,
    latency_duration=0.6,
    backlog_sizes=(1_000, 10_000),
    backlog_partitions=4,
    memory_backlog=10_000,
    systems=("queen", "raw"),
    latency_systems=("queen",),
    pop_wait_ms=200,
    fanout_producers=1,
    fanout_consumers=1,
    small_partitions=4,
    small_producers=4,
    small_consumers=4,
    small_push_producers=8,
    small_processes=2,
)

PROFILES = {p.name: p for p in (SMOKE, QUICK, FULL)}
