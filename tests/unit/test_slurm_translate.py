"""From Slurm's job records to replica events, and on through the real AppFSM.

The records are built by hand here because states like REQUEUED, NODE_FAIL
with requeue, or a controller that stops answering cannot be produced on
demand at the exact tick a test needs; the integration tests do the real thing.
"""

from __future__ import annotations

from supervisor.backends.base import AppCancelRequested, AppNotice
from supervisor.backends.slurm.poller import JobView
from supervisor.backends.slurm.records import (
    JobRecord,
    expand_hostlist,
    from_sacct,
    from_squeue,
    hosts_of_tasks,
)
from supervisor.backends.slurm.translate import Mail, ViewTranslator
from supervisor.events import ReplicaEvent
from supervisor.fsm.app import AppFSM, RoleSpec
from supervisor.states import AppState, ReplicaState

KEYS = [("trainer", 0), ("trainer", 1)]


def _view(
    state: str, *, restart: int = 0, codes: tuple[int | None, ...] = (0, 0), **kw: object
) -> JobView:
    comps = tuple(
        JobRecord(
            job_id=10 + i,
            het_job_id=10,
            het_offset=i,
            state=state,
            exit_code=code,
            nodes=f"n{i + 1}",
            restart_cnt=restart,
            **kw,  # type: ignore[arg-type]
        )
        for i, code in enumerate(codes)
    )
    return _job(*comps)


def _job(*components: JobRecord) -> JobView:
    return JobView(10, components, "queue")


def _assert_one_restart_each(views: list[JobView]) -> None:
    """One requeue: every replica restarted once, and no event names an attempt past 1."""
    fsm, mail = _run(views, max_retries=3)  # room to overcount
    assert fsm.state is AppState.SUCCEEDED
    assert [r.restarts for r in fsm.snapshot().roles[0].replicas] == [1, 1]
    assert max(getattr(m, "attempt", 0) for m in mail) == 1


def _run(views: list[JobView], *, max_retries: int = 1) -> tuple[AppFSM, list[Mail]]:
    translator = ViewTranslator(10, KEYS)
    fsm = AppFSM([RoleSpec("trainer", 2, max_retries=max_retries)])
    mail: list[Mail] = []

    for view in views:
        for item in translator.events(view):
            mail.append(item)
            if isinstance(item, ReplicaEvent):
                fsm.apply(item)
            elif isinstance(item, AppCancelRequested):
                fsm.cancel()
                translator.stopping = True
            else:
                fsm.set_notice(item.message)
    return fsm, mail


def test_a_plain_run_succeeds() -> None:
    fsm, _ = _run([_view("PENDING"), _view("RUNNING"), _view("COMPLETED")])
    assert fsm.state is AppState.SUCCEEDED
    assert fsm.snapshot().replica("trainer", 1).hostname == "n2"  # type: ignore[union-attr]


def test_node_failure_with_requeue_is_a_restart_not_a_failure() -> None:
    views = [
        _view("RUNNING"),
        _view("NODE_FAIL", requeue=True),
        _view("NODE_FAIL", requeue=True),  # seen twice: still one requeue
        _view("PENDING", restart=1),
        _view("RUNNING", restart=1),
        _view("COMPLETED", restart=1),
    ]
    fsm, _ = _run(views)
    assert fsm.state is AppState.SUCCEEDED
    assert fsm.num_restarts == 1  # one requeue of the whole job, however many replicas
    replica = fsm.snapshot().replica("trainer", 0)
    assert replica is not None and replica.restarts == 1
    app_path = [(t.source, t.dest) for t in fsm.history if t.role is None]
    assert ("RUNNING", "PENDING") in app_path and app_path[-1] == ("RUNNING", "SUCCEEDED")


def test_a_component_ended_by_its_leaders_requeue_is_part_of_that_requeue() -> None:
    # Seen on 22.05 when the node of a het job's leader goes DOWN: the leader is back in
    # the queue with the count bumped, its sibling shows FAILED (JobLaunchFailure) on the
    # old count until someone completes the requeue; then both run attempt 1.
    def half(sibling: str) -> JobView:
        return _job(
            JobRecord(10, 10, 0, "PENDING", restart_cnt=1, started=300, requeue=True),
            JobRecord(11, 10, 1, sibling, nodes="n2", reason="JobLaunchFailure",
                      started=100, requeue=True),
        )  # fmt: skip

    translator = ViewTranslator(10, KEYS)
    translator.events(_view("RUNNING", started=100, requeue=True))
    translator.events(half("COMPLETING"))
    assert translator.incomplete_requeue == 0  # still tearing down: nothing to complete yet
    translator.events(half("FAILED"))
    assert translator.incomplete_requeue == 1
    views = [
        _view("RUNNING", started=100, requeue=True),
        half("COMPLETING"),
        half("FAILED"),
        half("FAILED"),
        _view("PENDING", restart=1, started=300, requeue=True),
        _view("RUNNING", restart=1, started=310, requeue=True),
        _view("COMPLETED", restart=1, started=310, requeue=True),
    ]
    fsm, mail = _run(views, max_retries=1)  # a failure counted as well would fail the app
    assert fsm.state is AppState.SUCCEEDED, fsm.snapshot()
    assert fsm.num_restarts == 1
    assert [r.restarts for r in fsm.snapshot().roles[0].replicas] == [1, 1]
    assert not any(isinstance(m, AppCancelRequested) for m in mail)


def test_a_job_slurm_ended_itself_is_over_one_its_script_requeued_is_not() -> None:
    translator = ViewTranslator(10, KEYS)
    translator.events(_view("RUNNING", started=100))
    assert not translator.ended
    translator.events(_view("TIMEOUT", started=100, reason="TimeLimit"))
    assert translator.ended  # the batch script was killed: only a requeue from outside retries
    translator = ViewTranslator(10, KEYS)
    translator.events(_view("NODE_FAIL", requeue=True))
    assert not translator.ended  # Slurm requeues it itself


def test_failed_replica_is_blamed_not_the_ones_killed_with_it() -> None:
    comps = (
        JobRecord(10, 10, 0, "FAILED", signal=15, nodes="n1"),
        JobRecord(11, 10, 1, "FAILED", exit_code=3, nodes="n2"),
    )
    fsm, _ = _run([_view("RUNNING"), _job(*comps)], max_retries=0)
    snap = fsm.snapshot()
    assert snap.state is AppState.FAILED
    assert snap.replica("trainer", 1).state is ReplicaState.FAILED  # type: ignore[union-attr]
    assert snap.replica("trainer", 0).state is ReplicaState.CANCELLED  # type: ignore[union-attr]
    assert "trainer/1" in snap.msg


def test_a_cancel_made_outside_is_a_cancel() -> None:
    fsm, mail = _run([_view("RUNNING"), _view("CANCELLED", codes=(0, 0))])
    assert fsm.state is AppState.CANCELLED
    assert any(isinstance(m, AppCancelRequested) for m in mail)


def test_errors_change_nothing_and_are_shown_while_they_last() -> None:
    error = JobView(10, (), "error", "squeue failed: slurmctld restarting")
    fsm, mail = _run([_view("RUNNING"), error, error])
    assert fsm.state is AppState.RUNNING
    assert "slurmctld restarting" in fsm.snapshot().msg
    fsm, _ = _run([_view("RUNNING"), error, _view("RUNNING")])
    assert fsm.snapshot().msg == ""
    assert all(not isinstance(m, AppNotice) or m.message for m in mail[:2])


def test_an_error_that_lasts_is_told_once_and_a_new_one_again() -> None:
    """The poller asks every tick while the controller fails: one notice per error."""
    first = JobView(10, (), "error", "squeue failed: slurmctld restarting")
    other = JobView(10, (), "error", "squeue failed: connection refused")
    translator = ViewTranslator(10, KEYS)
    notices = [
        [m.message for m in translator.events(v) if isinstance(m, AppNotice)]
        for v in (first, first, first, other, other, _view("RUNNING"), first)
    ]
    assert notices == [
        [first.problem],
        [],
        [],
        [other.problem],
        [],
        [""],
        [first.problem],
    ]


def test_a_job_gone_without_accounting_is_unknown_with_a_reason() -> None:
    gone = JobView(
        10, (), "gone", "the job left the controller and this cluster keeps no accounting"
    )
    fsm, _ = _run([_view("RUNNING"), gone])
    snap = fsm.snapshot()
    assert snap.state is AppState.UNKNOWN
    assert "no accounting" in snap.roles[0].replicas[0].msg


def test_parsers_accept_both_state_shapes_and_exit_encodings() -> None:
    old = from_squeue({"job_id": 5, "het_job_id": 4, "het_job_offset": 1, "job_state": "FAILED",
                       "derived_exit_code": 768, "exit_code": 36608})  # fmt: skip
    exited_3 = {"status": ["EXITED"], "return_code": {"set": True, "number": 3}}
    new = from_squeue({"job_id": 5, "het_job_id": 4, "het_job_offset": 1, "job_state": ["FAILED"],
                       "derived_exit_code": exited_3})  # fmt: skip
    assert (old.state, old.exit_code, old.het_job_id) == ("FAILED", 3, 4)
    assert (new.state, new.exit_code) == ("FAILED", 3)
    killed = from_squeue({"job_id": 7, "job_state": "CANCELLED", "derived_exit_code": 15})
    assert (killed.exit_code, killed.signal, killed.het_job_id) == (None, 15, 7)
    acct = from_sacct({"job_id": 9, "het": {"job_id": 8, "job_offset": 1},
                       "state": {"current": "COMPLETED", "reason": "None"},
                       "derived_exit_code": {"status": "SUCCESS", "return_code": 0}})  # fmt: skip
    assert (acct.het_job_id, acct.het_offset, acct.state, acct.exit_code) == (8, 1, "COMPLETED", 0)


def test_a_requeue_is_seen_even_when_the_restart_count_stays_at_zero() -> None:
    # Slurm 22.05 leaves restart_cnt at 0 for a het job that requeued itself.
    views = [
        _view("RUNNING", started=100),
        _view("PENDING", started=300),  # back in the queue: its expected start time
        _view("RUNNING", started=200),
        _view("COMPLETED", started=200),
    ]
    fsm, _ = _run(views)
    assert fsm.state is AppState.SUCCEEDED
    assert [r.restarts for r in fsm.snapshot().roles[0].replicas] == [1, 1]


def test_a_requeue_missed_between_two_ticks_is_seen_from_the_new_start_time() -> None:
    fsm, _ = _run([_view("RUNNING", started=100), _view("COMPLETED", started=250)])
    assert fsm.state is AppState.SUCCEEDED
    assert [r.restarts for r in fsm.snapshot().roles[0].replicas] == [1, 1]
    fsm, _ = _run([_view("RUNNING", started=100), _view("COMPLETED", started=100)])
    assert [r.restarts for r in fsm.snapshot().roles[0].replicas] == [0, 0]


def test_one_requeue_seen_over_several_ticks_counts_once() -> None:
    # Seen on 22.05 with fast ticks: REQUEUED before and after the restart count moved.
    views = [
        _view("RUNNING", started=100),
        _view("REQUEUED", started=100),
        _view("REQUEUED", restart=1, started=100),
        _view("PENDING", restart=1, started=300),
        _view("RUNNING", restart=1, started=200),
        _view("COMPLETED", restart=1, started=200),
    ]
    fsm, _ = _run(views, max_retries=3)  # room to overcount
    assert fsm.state is AppState.SUCCEEDED
    assert [r.restarts for r in fsm.snapshot().roles[0].replicas] == [1, 1]


def test_a_second_requeue_after_a_run_counts_again() -> None:
    views = [
        _view("RUNNING", started=100),
        _view("REQUEUED", started=100),
        _view("RUNNING", started=200),
        _view("REQUEUED", started=200),
        _view("PENDING", started=400),
        _view("RUNNING", started=300),
        _view("COMPLETED", started=300),
    ]
    fsm, _ = _run(views, max_retries=2)
    assert fsm.state is AppState.SUCCEEDED
    assert [r.restarts for r in fsm.snapshot().roles[0].replicas] == [2, 2]


def test_the_teardown_of_a_requeued_run_is_not_a_new_run() -> None:
    # Seen on 22.05 (fast ticks): one component COMPLETING with the count already
    # bumped and the next start time set, the other already PENDING again.
    first = _job(
        JobRecord(10, 10, 0, "COMPLETING", nodes="n1", restart_cnt=1, started=571),
        JobRecord(11, 10, 1, "PENDING", nodes="n2", restart_cnt=1, started=577),
    )
    views = [
        _view("RUNNING", started=567),
        first,
        _view("PENDING", restart=1, started=577),
        _view("RUNNING", restart=1, started=578),
        _view("COMPLETED", restart=1, started=578),
    ]
    _assert_one_restart_each(views)


def test_a_teardown_seen_over_two_ticks_is_still_not_a_new_run() -> None:
    # Seen on slurmrestd (22.05): the teardown of the requeued run lasts two ticks and
    # its start time moves by a second in between; the second tick must not start
    # attempt 1, or the job going back to PENDING then counts as a second requeue.
    def teardown(started: int) -> JobView:
        return _job(
            JobRecord(10, 10, 0, "COMPLETING", nodes="n1", restart_cnt=1, started=started),
            JobRecord(11, 10, 1, "PENDING", nodes="n2", restart_cnt=1, started=590),
        )

    views = [
        _view("RUNNING", started=584),
        teardown(584),
        teardown(585),
        _view("PENDING", restart=1, started=591),
        _view("PENDING", restart=1, started=0),
        _view("COMPLETED", restart=1, started=592),
    ]
    _assert_one_restart_each(views)


def test_a_group_of_tasks_gives_each_replica_the_components_state() -> None:
    """One het component (N nodes x M tasks) stands for every replica of its role."""
    translator = ViewTranslator(10, KEYS, [KEYS])
    comp = JobRecord(job_id=10, het_job_id=10, het_offset=0, state="RUNNING", nodes="n[1-2]")
    events = translator.events(_job(comp))
    assert [(type(e).__name__, getattr(e, "key", None)) for e in events] == [
        ("Started", ("trainer", 0)),
        ("Started", ("trainer", 1)),
    ]
    # Each task reports its own node, not the group's list (issue 17 item 7).
    assert [getattr(e, "hostname", None) for e in events] == ["n1", "n2"]


def test_node_lists_expand_to_each_tasks_node() -> None:
    assert expand_hostlist("n[1-3,5],gpu[08-10],login") == [
        "n1", "n2", "n3", "n5", "gpu08", "gpu09", "gpu10", "login",
    ]  # fmt: skip
    assert hosts_of_tasks("n[1-2]", 4) == ["n1", "n1", "n2", "n2"]
    assert hosts_of_tasks("n3", 1) == ["n3"]
    assert hosts_of_tasks("n[1-3]", 4) == ["n[1-3]"] * 4  # does not divide: the list as given


def test_the_pending_reason_is_shown_while_the_app_waits() -> None:
    fsm, _ = _run([_view("PENDING", reason="Priority"), _view("PENDING", reason="Resources")])
    status = fsm.snapshot()
    assert status.state is AppState.PENDING
    assert status.msg == "pending: Resources"
    assert status.roles[0].replicas[0].msg == "Resources"
    fsm, _ = _run([_view("PENDING", reason="Resources"), _view("RUNNING")])
    assert "pending" not in fsm.snapshot().msg


def test_cancelling_a_pending_job_records_no_start() -> None:
    fsm, _ = _run([_view("PENDING", reason="Resources"), _view("CANCELLED", codes=(None, None))])
    assert fsm.state is AppState.CANCELLED
    assert not any(t.dest == "RUNNING" for t in fsm.history)


def test_the_replica_that_wrote_an_error_file_is_the_root_cause() -> None:
    """Slurm reports a gang's failures together: the one with an error file explains it."""
    from supervisor.events import Exited, Started

    fsm = AppFSM([RoleSpec("trainer", 2)])

    for k in (0, 1):
        fsm.apply(Started(role="trainer", replica_id=k, attempt=0))
    fsm.apply(Exited(role="trainer", replica_id=0, attempt=0, exit_code=1))
    fsm.apply(
        Exited(
            role="trainer",
            replica_id=1,
            attempt=0,
            exit_code=1,
            structured_error_msg='{"message": "boom"}',
        )
    )
    status = fsm.snapshot()
    assert status.state is AppState.FAILED
    assert status.structured_error_msg == '{"message": "boom"}'
    assert status.msg.startswith("trainer/1")


def test_the_replica_still_completing_is_blamed_not_the_ones_killed_because_of_it() -> None:
    """Seen on the real cluster: the failing replica COMPLETING, the gang already killed."""
    killed = JobRecord(11, 10, 1, "FAILED", signal=15, nodes="n2")
    views = [
        _view("RUNNING"),
        _job(JobRecord(10, 10, 0, "COMPLETING", nodes="n1"), killed),
        _job(JobRecord(10, 10, 0, "FAILED", exit_code=3, nodes="n1"), killed),
    ]
    fsm, _ = _run(views, max_retries=0)
    snap = fsm.snapshot()
    assert snap.state is AppState.FAILED
    failed = snap.replica("trainer", 0)
    assert failed is not None and failed.state is ReplicaState.FAILED and failed.exit_code == 3
    assert snap.replica("trainer", 1).state is ReplicaState.CANCELLED  # type: ignore[union-attr]
    assert snap.msg.startswith("trainer/0")


def test_a_replica_that_stays_completing_holds_the_others_ends_only_a_few_views() -> None:
    from supervisor.backends.slurm.translate import HOLD_VIEWS

    stuck = JobRecord(10, 10, 0, "COMPLETING", nodes="n1")
    killed = JobRecord(11, 10, 1, "FAILED", signal=15, nodes="n2")
    held, _ = _run([_view("RUNNING")] + [_job(stuck, killed)] * HOLD_VIEWS, max_retries=0)
    assert held.snapshot().replica("trainer", 1).state is ReplicaState.RUNNING  # type: ignore[union-attr]
    fsm, _ = _run([_view("RUNNING")] + [_job(stuck, killed)] * (HOLD_VIEWS + 1), max_retries=0)
    killed_status = fsm.snapshot().replica("trainer", 1)
    assert killed_status is not None and killed_status.state is ReplicaState.FAILED


def test_our_own_stop_is_not_held_back() -> None:
    translator = ViewTranslator(10, KEYS)
    translator.events(_view("RUNNING"))
    translator.stopping = True
    mail = translator.events(
        _job(
            JobRecord(10, 10, 0, "COMPLETING", nodes="n1"),
            JobRecord(11, 10, 1, "FAILED", signal=15, nodes="n2"),
        )
    )
    assert any(type(m).__name__ == "Exited" and m.replica_id == 1 for m in mail)  # type: ignore[union-attr]
