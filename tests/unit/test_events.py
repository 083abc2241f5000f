"""The waiter registry: who is woken by a notification, a fallback, a reconnect, a shutdown."""

from __future__ import annotations

import threading
import time

from queen import wakeup
from queen.events import Events
from queen.models import PopRoute
from queen.wakeup import keys_for, parse, route_key

BY_PARTITION = PopRoute(queue="q", partition="p")
BY_QUEUE = PopRoute(queue="q")
BY_NAMESPACE = PopRoute(namespace="ns")
ANYTHING = PopRoute()


def payload(queue: str = "q", partition: str = "p", namespace: str = "", task: str = "") -> str:
    return wakeup.payload(queue, partition, namespace, task)


def test_a_notification_serves_its_partition_queue_and_matching_filters():
    keys = set(keys_for(parse(payload(namespace="ns", task="t"))))
    assert route_key(BY_PARTITION) in keys
    assert route_key(BY_QUEUE) in keys
    assert route_key(BY_NAMESPACE) in keys
    assert route_key(PopRoute(task="t")) in keys
    assert route_key(PopRoute(namespace="ns", task="t")) in keys
    assert route_key(ANYTHING) in keys
    assert route_key(PopRoute(queue="q", partition="other")) not in keys
    assert route_key(PopRoute(namespace="other")) not in keys
    assert route_key(PopRoute(queue="other")) not in keys


def test_one_notification_wakes_one_waiter_the_oldest():
    events = Events()
    with events.subscribe(BY_QUEUE) as first, events.subscribe(BY_PARTITION) as second:
        assert events.notify(payload())
        assert first.event.is_set() and not second.event.is_set()
        assert events.notify(payload())
        assert second.event.is_set()
        assert not events.notify(payload())  # nobody left armed: no one to wake
        assert events.waiting == 2


def test_one_notification_wakes_the_oldest_waiter_of_each_consumer_group():
    events = Events()
    with (
        events.subscribe(PopRoute(queue="q", consumer_group="a")) as a1,
        events.subscribe(PopRoute(queue="q", partition="p", consumer_group="a")) as a2,
        events.subscribe(PopRoute(queue="q", consumer_group="b")) as b1,
        events.subscribe(BY_QUEUE) as queue_mode,
        events.subscribe(PopRoute(queue="other", consumer_group="c")) as elsewhere,
    ):
        assert events.notify(payload())
        assert a1.event.is_set() and b1.event.is_set() and queue_mode.event.is_set()
        assert not a2.event.is_set() and not elsewhere.event.is_set()
        assert events.notify(payload())  # group a's next waiter; the others are not armed
        assert a2.event.is_set()
        assert not events.notify(payload())


def test_a_notification_naming_a_group_wakes_a_waiter_of_that_group_only():
    events = Events()
    with (
        events.subscribe(PopRoute(queue="q", consumer_group="a")) as a,
        events.subscribe(PopRoute(queue="q", consumer_group="b")) as b,
        events.subscribe(BY_QUEUE) as queue_mode,
    ):
        assert events.notify(payload() + "/b")
        assert b.event.is_set() and not a.event.is_set() and not queue_mode.event.is_set()
        assert b.hint == "q/p///b"
        assert events.notify(payload() + "/__queue__")  # queue mode's own name
        assert queue_mode.event.is_set() and not a.event.is_set()
        assert not events.notify(payload() + "/nobody")
        assert not a.event.is_set()


def test_an_unused_wake_up_goes_to_a_waiter_of_the_same_group():
    events = Events()
    with (
        events.subscribe(PopRoute(queue="q", consumer_group="b")) as other_group,
        events.subscribe(PopRoute(queue="q", consumer_group="a")) as same_group,
    ):
        with events.subscribe(PopRoute(queue="q", consumer_group="a")) as leaves:
            events._disarm(same_group)  # busy checking the database
            events._disarm(other_group)
            events.notify(payload())
            assert leaves.event.is_set()
            events._arm(other_group)
            events._arm(same_group)
        assert same_group.event.is_set()
        assert not other_group.event.is_set()  # older, but a wake-up of group a stays in a


def test_notifications_for_other_routes_wake_nobody():
    events = Events()
    with events.subscribe(BY_PARTITION) as waiter:
        assert not events.notify(payload(partition="other"))
        assert not events.notify(payload(queue="other"))
        assert not waiter.event.is_set()


def test_a_woken_waiter_is_armed_again_behind_the_others():
    events = Events()
    with events.subscribe(BY_QUEUE) as a, events.subscribe(BY_QUEUE) as b:
        events.notify(payload())
        assert a.wait(0) is True  # consumes the wake-up and re-arms a, now the newest
        events.notify(payload())
        assert b.event.is_set() and not a.event.is_set()


def test_wait_times_out_without_a_wake_up():
    events = Events()
    with events.subscribe(BY_QUEUE) as waiter:
        started = time.monotonic()
        assert waiter.wait(0.05) is False
        assert time.monotonic() - started >= 0.04


def test_a_wake_up_that_arrives_before_wait_is_not_lost():
    events = Events()
    with events.subscribe(BY_QUEUE) as waiter:
        events.notify(payload())  # e.g. while the waiter was still querying
        assert waiter.wait(5) is True


def test_an_unused_wake_up_is_passed_on_when_the_waiter_leaves():
    events = Events()
    with events.subscribe(BY_PARTITION) as stays:
        with events.subscribe(BY_QUEUE) as leaves:
            events._disarm(stays)  # stays is busy checking the database
            events.notify(payload())
            assert leaves.event.is_set()
            events._arm(stays)
        # leaves went away (deadline, client gone) without re-checking: stays gets it
        assert stays.event.is_set()
    assert events.waiting == 0


def test_forward_hands_the_last_wake_up_to_another_waiter():
    events = Events()
    with events.subscribe(BY_QUEUE) as gone, events.subscribe(BY_QUEUE) as other:
        events.notify(payload())
        assert gone.wait(0)
        gone.forward()  # its client disconnected: it will not claim
        assert other.event.is_set()
        assert not gone.event.is_set()


def test_wake_all_and_shutdown_release_everyone():
    events = Events()
    with events.subscribe(BY_QUEUE) as a, events.subscribe(BY_PARTITION) as b:
        assert events.wake_all() == 2
        assert a.event.is_set() and b.event.is_set()
    with events.subscribe(BY_QUEUE) as c:
        events.shutdown()
        assert c.event.is_set() and events.shutting_down
        assert c.wait(0) is True
        assert not events.notify(payload())  # not re-armed while shutting down


def test_fallback_without_a_ready_check_wakes_the_oldest_waiter_of_each_route():
    events = Events()
    with (
        events.subscribe(BY_QUEUE) as a,
        events.subscribe(BY_QUEUE) as b,
        events.subscribe(BY_PARTITION) as c,
    ):
        assert events.recheck() == 2
        assert a.event.is_set() and c.event.is_set() and not b.event.is_set()


def test_fallback_asks_the_database_once_for_every_route_and_wakes_per_ready_partition():
    calls = []

    def ready(queues, partitions, filters, limit):
        calls.append((sorted(queues), sorted(partitions), sorted(filters, key=str), limit))
        return [payload(partition="p1"), payload(queue="z", partition="p9")]

    events = Events(ready=ready)
    with (
        events.subscribe(BY_QUEUE) as a,
        events.subscribe(BY_QUEUE) as b,
        events.subscribe(BY_QUEUE) as c,
        events.subscribe(PopRoute(queue="x", partition="y")),
        events.subscribe(BY_NAMESPACE),
    ):
        assert events.recheck() == 1  # one ready partition of q; z has nobody waiting
        assert a.event.is_set() and not b.event.is_set() and not c.event.is_set()
    assert calls == [(["q"], [("x", "y")], [("ns", None)], 5)]
    assert events.recheck() == 0  # nobody waiting: no query
    assert len(calls) == 1


def test_a_failing_ready_check_wakes_nobody():
    def ready(*args):
        raise RuntimeError("database down")

    events = Events(ready=ready)
    with events.subscribe(BY_QUEUE) as waiter:
        assert events.recheck() == 0
        assert not waiter.event.is_set()


def test_threads_parked_on_one_route_are_each_woken_exactly_once_per_notification():
    events = Events()
    woken: list[int] = []
    lock = threading.Lock()
    ready = threading.Barrier(51)

    def park(i: int) -> None:
        with events.subscribe(BY_QUEUE) as waiter:
            ready.wait()
            if waiter.wait(5):
                with lock:
                    woken.append(i)

    threads = [threading.Thread(target=park, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    ready.wait()
    for _ in range(20):
        events.notify(payload())
    time.sleep(0.2)
    assert len(woken) == 20
    events.shutdown()
    for t in threads:
        t.join(5)
    assert len(set(woken)) == len(woken)


def test_a_wake_up_carries_the_notification_that_caused_it():
    events = Events()
    with events.subscribe(BY_QUEUE) as a, events.subscribe(BY_QUEUE) as b:
        events.notify(payload(partition="p7"))
        assert a.hint == "q/p7//"
        events.wake_all()
        assert b.hint is None  # woken to re-check, not for a partition
