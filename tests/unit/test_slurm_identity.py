"""What ties an app to its Slurm job beyond the bare id (issue 19 item 10)."""

from __future__ import annotations

from supervisor.backends.slurm.identity import SUBMIT_SLACK_S, JobIdentity
from supervisor.backends.slurm.records import JobRecord

TAG = "asupervisor:svc/app-1"
ID = JobIdentity(TAG, ("w-0", "w-1"), 1000.0)


def _rec(offset: int = 0, **kw: object) -> JobRecord:
    fields: dict[str, object] = {"comment": TAG, "name": f"w-{offset}", "submitted": 1001}
    fields.update(kw)
    return JobRecord(7, 7, offset, "RUNNING", **fields)  # type: ignore[arg-type]


def test_our_job_is_ours_even_requeued_later() -> None:
    assert ID.owns(_rec()) and ID.owns(_rec(1))
    assert ID.owns(_rec(comment=f"{TAG} the user's comment"))
    assert ID.owns(_rec(submitted=99999))  # a requeue moves the submit time on


def test_another_job_with_the_same_id_is_not() -> None:
    assert not ID.owns(_rec(comment=""))  # the controller always shows our comment
    assert not ID.owns(_rec(comment="asupervisor:svc/app-10"))
    assert not ID.owns(_rec(name="unrelated"))
    assert not ID.owns(_rec(submitted=int(1000 - SUBMIT_SLACK_S - 1)))


def test_accounting_without_comments_is_judged_by_name_and_time() -> None:
    assert ID.owns(_rec(comment="", source="sacct"))
    assert not ID.owns(_rec(comment="", source="sacct", name="unrelated"))


def test_records_written_before_the_identity_was_kept_check_the_tag_only() -> None:
    old = JobIdentity.from_json(None, TAG)
    assert old.owns(_rec(name="anything", submitted=1))
    assert not old.owns(_rec(comment="someone else"))
    assert JobIdentity.from_json(ID.to_json(), "ignored") == ID
