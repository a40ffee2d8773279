"""RestTransport without a cluster: directive translation, and faults a real slurmrestd cannot make.

``httpx.MockTransport`` stands in for slurmrestd ONLY for answers the real one
cannot be made to give on demand: 5xx from a proxy, connection refused or
denied, timeouts, malformed JSON, ``errors`` arrays naming an unreachable
controller or slurmdbd, stale duplicate accounting records, a cluster without
accounting (404 on ``/slurmdb``). Everything a real slurmrestd answers on
request (submissions, het jobs, an unknown partition, a held job, "nothing
found", a bad or missing token, cancel, facts) is checked against the real one
in tests/integration/test_slurm_rest.py. Parsing the script's ``#SBATCH``
lines needs no server at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from supervisor.backends.slurm.records import latest_per_component
from supervisor.backends.slurm.rest import RestTransport, parse_batch_script
from supervisor.backends.slurm.transport import AccountingDisabled
from supervisor.errors import BackendError, SpecError, SubmitError

pytestmark = pytest.mark.anyio

GOLDEN = Path(__file__).parent / "golden"
META = {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"version": {"major": 22, "minor": 5}}}
Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]


def _answer(status: int = 200, **body: Any) -> httpx.Response:
    return httpx.Response(status, json={"meta": META, "errors": [], **body})


def _errors(status: int, *errors: dict[str, Any], **body: Any) -> httpx.Response:
    return httpx.Response(status, json={"meta": META, "errors": list(errors), **body})


def _transport(handler: Handler, **kwargs: Any) -> RestTransport:
    kwargs.setdefault("socket", "/nonexistent/slurmrestd.sock")
    return RestTransport(http_transport=httpx.MockTransport(handler), **kwargs)


async def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


async def _never_called(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"no request expected, got {request.method} {request.url}")


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "socket"),
        ({"socket": "/s", "url": "http://h"}, "socket"),
        ({"url": "http://h", "token": "t"}, "token"),
        ({"url": "http://h", "user": "u"}, "token"),
        ({"socket": "/s", "timeout": 0}, "timeout"),
    ],
)
def test_bad_settings_are_spec_errors(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        RestTransport(**kwargs)
    assert field in err.value.fields


# ---------------------------------------------------------------- #SBATCH lines (no server)


def test_golden_het_script_becomes_one_property_object_per_component() -> None:
    components = parse_batch_script((GOLDEN / "all_options.sbatch").read_text())
    assert [c["job_name"] for c in components] == ["trainer-0", "trainer-1", "ps-0"]
    first = components[0]
    assert first["standard_output"] == "/state/logs/svc/train-0001/slurm-%j.out"
    assert first["comment"] == "asupervisor:svc/train-0001 nightly run"  # quoted, with a space
    assert first["requeue"] is True and first["time_limit"] == "1-02:00:00"
    assert first["mail_type"] == "END,FAIL" and first["mail_user"] == "me@example.com"
    assert components[2]["memory_per_node"] == "512" and components[2]["cpus_per_task"] == "1"
    # What sbatch propagates to later components, they get; mail goes to the leader only.
    for later in components[1:]:
        assert later["comment"] == first["comment"]
        assert later["time_limit"] == "1-02:00:00" and later["requeue"] is True
        assert "mail_type" not in later and "mail_user" not in later


def test_directive_forms_sbatch_accepts() -> None:
    script = (
        "#!/bin/bash\n"
        "# a plain comment\n"
        "#SBATCH -J name -n 2 -c4 --time 10\n"
        "#SBATCH --no-requeue --exclusive --mem=100 --cpus-per-task=2\n"
        "#SBATCH --requeue  # an unquoted hash ends the line, as in sbatch\n"
        "#SBATCH --comment=a#b\n"
        "#SBATCH hetjob\n"
        "#SBATCH --ntasks=1\n"
        "\n"
        "echo hi\n"
        "#SBATCH --partition=ignored-after-the-first-command\n"
    )
    first, second = parse_batch_script(script)
    assert first == {
        "job_name": "name",
        "ntasks": "2",
        "cpus_per_task": "2",
        "time_limit": "10",
        "exclusive": "exclusive",
        "memory_per_node": "100",
        "requeue": True,  # the later --requeue undoes --no-requeue
        "comment": "a",
    }
    # --cpus-per-task and --exclusive start afresh in each component; --mem and --time carry.
    assert second == {
        "job_name": "name",
        "time_limit": "10",
        "memory_per_node": "100",
        "requeue": True,
        "comment": "a",
        "ntasks": "1",
    }


@pytest.mark.parametrize(
    "line",
    ["#SBATCH --export=ALL", "#SBATCH --wrap=true", "#SBATCH --no-such-option", "#SBATCH -M x"],
)
async def test_directives_slurmrestd_cannot_take_are_refused_before_sending(line: str) -> None:
    transport = _transport(_never_called)
    with pytest.raises(SubmitError) as err:
        await transport.submit(f"#!/bin/bash\n{line}\ntrue\n", "/tmp")
    assert not err.value.transient
    assert "not supported over slurmrestd" in str(err.value)
    assert transport.calls == {}


def test_submission_body_is_sbatch_chdir_with_the_script_on_stdin() -> None:
    transport = RestTransport(url="http://h", environment={"PATH": "/bin", "LANG": "C"})
    single = transport.submission("#!/bin/bash\n#SBATCH --chdir=/elsewhere\ntrue\n", "/work")
    assert single == {
        "script": "#!/bin/bash\n#SBATCH --chdir=/elsewhere\ntrue\n",
        "job": {
            "current_working_directory": "/work",  # sbatch's --chdir beats the script's
            "job_name": "sbatch",  # what sbatch calls an unnamed job read from stdin
            "environment": {"PATH": "/bin", "LANG": "C"},
        },
    }
    het = transport.submission((GOLDEN / "basic.sbatch").read_text(), "/work")
    assert set(het) == {"script", "jobs"} and len(het["jobs"]) == 3
    for component in het["jobs"]:
        assert component["environment"] == {"PATH": "/bin", "LANG": "C"}
        assert component["current_working_directory"] == "/work"  # every component, as sbatch
    assert [c["job_name"] for c in het["jobs"]] == ["trainer-0", "trainer-1", "ps-0"]


def test_default_environment_is_the_callers_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/opt/x/bin:/usr/bin")
    monkeypatch.setenv("HOME", "/home/caller")
    monkeypatch.delenv("ASUPERVISOR_PYTHON", raising=False)
    assert RestTransport(url="http://h").environment == {"PATH": "/opt/x/bin:/usr/bin"}
    monkeypatch.setenv("ASUPERVISOR_PYTHON", "/opt/py/bin/python3")  # the script reads it
    assert RestTransport(url="http://h").environment["ASUPERVISOR_PYTHON"] == "/opt/py/bin/python3"
    monkeypatch.delenv("PATH")
    assert RestTransport(url="http://h").environment["PATH"].endswith("/usr/bin:/sbin:/bin")


# ---------------------------------------------------------------- transport faults


async def test_connection_refused_is_transient_and_counted() -> None:
    transport = _transport(_refused)
    with pytest.raises(BackendError) as err:
        await transport.queue()
    assert err.value.transient and "Connection refused" in str(err.value)
    with pytest.raises(SubmitError) as submit_err:
        await transport.submit("#!/bin/bash\ntrue\n", "/tmp")
    assert submit_err.value.transient
    with pytest.raises(BackendError):
        await transport.cancel(5)
    assert transport.calls == {"jobs": 1, "submit": 1, "cancel": 1}


async def test_a_socket_we_may_not_open_is_not_transient() -> None:
    async def denied(request: httpx.Request) -> httpx.Response:
        try:
            raise PermissionError(13, "Permission denied")
        except PermissionError as e:
            raise httpx.ConnectError("[Errno 13] Permission denied", request=request) from e

    with pytest.raises(BackendError) as err:
        await _transport(denied).queue()
    assert not err.value.transient


async def test_timeouts_are_transient() -> None:
    async def read_timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async def hangs(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(30)
        raise AssertionError("not reached")

    with pytest.raises(BackendError) as err:
        await _transport(read_timeout).queue()
    assert err.value.transient
    slow = _transport(hangs, timeout=0.2)
    with anyio.fail_after(5):
        with pytest.raises(BackendError) as err:
            await slow.accounting([1])
    assert err.value.transient and "did not answer in 0.2 s" in str(err.value)
    assert slow.calls == {"slurmdb_jobs": 1}


@pytest.mark.parametrize(
    ("status", "body", "transient"),
    [
        (502, b"<html>Bad Gateway</html>", True),
        (503, b"", True),
        (200, b'{"jobs": [', True),  # cut short
        (200, b"[]", True),  # JSON, but not an object
        (200, b"not json at all", True),
    ],
)
async def test_answers_that_are_not_slurmrestd_json(
    status: int, body: bytes, transient: bool
) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        # The JWT travels with every request.
        assert request.headers["X-SLURM-USER-NAME"] == "alice"
        assert request.headers["X-SLURM-USER-TOKEN"] == "tok"
        return httpx.Response(status, content=body)

    transport = RestTransport(
        url="http://rest.example:6820",
        token="tok",
        user="alice",
        http_transport=httpx.MockTransport(handler),
    )
    with pytest.raises(BackendError) as err:
        await transport.queue()
    assert err.value.transient is transient
    assert "rest.example:6820" in str(err.value)


CONTROLLER_DOWN = {
    "error_number": 1800,
    "error": "Unable to contact slurm controller (connect failure)",
    "source": "slurm_load_jobs",
}
DBD_DOWN = {"error_number": 7000, "error": "Unable to connect to database"}
UNSPECIFIED = {
    "description": "Failed while looking for jobs",
    "error_number": -1,
    "error": "Unspecified error",
    "source": "slurm_load_jobs",
}


async def test_errors_arrays_decide_transience_with_the_servers_words() -> None:
    answers = {
        "/slurm/v0.0.38/jobs": _errors(500, CONTROLLER_DOWN, jobs=[]),
        "/slurm/v0.0.38/job/submit": _errors(500, CONTROLLER_DOWN, job_id=None),
        "/slurmdb/v0.0.38/jobs": _errors(500, DBD_DOWN, jobs=[]),
    }

    async def handler(request: httpx.Request) -> httpx.Response:
        return answers[request.url.path]

    transport = _transport(handler)
    with pytest.raises(BackendError) as err:
        await transport.queue()
    assert err.value.transient and "Unable to contact slurm controller" in str(err.value)
    with pytest.raises(SubmitError) as submit_err:
        await transport.submit("#!/bin/bash\ntrue\n", "/tmp")
    assert submit_err.value.transient
    with pytest.raises(BackendError) as acct_err:
        await transport.accounting([7])
    assert acct_err.value.transient and not isinstance(acct_err.value, AccountingDisabled)
    assert "Unable to connect to database" in str(acct_err.value)


async def test_a_permanent_code_is_not_transient_even_with_http_500() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        bad = {"error_number": 2017, "error": "Invalid job id specified"}
        return _errors(500, bad, CONTROLLER_DOWN | {"error_number": 2045, "error": "x"})

    with pytest.raises(BackendError) as err:
        await _transport(handler).cancel(3)
    assert not err.value.transient and "Invalid job id specified (error 2017)" in str(err.value)


async def test_an_unspecified_error_with_http_500_is_taken_as_transient() -> None:
    """slurmrestd 22.05 says only "Unspecified error" when slurmctld cannot be reached."""

    async def handler(request: httpx.Request) -> httpx.Response:
        return _errors(500, UNSPECIFIED, jobs=[])

    with pytest.raises(BackendError) as err:
        await _transport(handler).queue()
    assert err.value.transient
    assert "Failed while looking for jobs: Unspecified error" in str(err.value)


async def test_a_submission_answer_without_a_job_id_is_a_submit_error() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return _answer(job_id=None, step_id="BATCH")

    transport = _transport(handler)
    with pytest.raises(SubmitError) as err:
        await transport.submit("#!/bin/bash\ntrue\n", "/tmp")
    assert not err.value.transient and "no job id" in str(err.value)
    assert transport.calls == {"submit": 1}


async def test_no_slurmdb_endpoints_means_accounting_is_disabled() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        text = "Unable find requested URL. Please view /openapi/v3 for API reference."
        return httpx.Response(404, text=text)

    transport = _transport(handler)
    with pytest.raises(AccountingDisabled) as err:
        await transport.accounting([1, 2])
    assert not err.value.transient and "keeps no accounting" in str(err.value)
    assert transport.calls == {"slurmdb_jobs": 1}


async def test_accounting_storage_disabled_words_mean_accounting_is_disabled() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return _errors(500, {"error_number": -1, "error": "Slurm accounting storage is disabled"})

    with pytest.raises(AccountingDisabled):
        await _transport(handler).accounting([1])


def _sacct(job_id: int, het: int, offset: int | None, state: str, submitted: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "het": {"job_id": het, "job_offset": offset},
        "state": {"current": state, "reason": "None"},
        "exit_code": {"status": "SUCCESS", "return_code": 0},
        "derived_exit_code": {"status": "SUCCESS", "return_code": 0},
        "nodes": "n1",
        "time": {"submission": submitted, "start": submitted},
    }


async def test_accounting_is_one_call_for_every_id_and_keeps_every_record() -> None:
    """A controller that lost its state reuses ids: slurmdbd then holds stale records too.

    Like the CLI transport, every record comes back; the poller's
    ``latest_per_component`` picks the job as it is now.
    """
    seen: list[httpx.Request] = []
    jobs = [
        _sacct(12, 0, None, "PENDING", 100),  # stale: a job 12 from before the state was lost
        _sacct(12, 12, 0, "COMPLETED", 200),
        _sacct(13, 12, 1, "COMPLETED", 200),
        _sacct(40, 40, 0, "FAILED", 300),
        _sacct(99, 99, 0, "COMPLETED", 300),  # not asked for
    ]

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _answer(jobs=jobs)

    transport = _transport(handler)
    records = await transport.accounting([40, 12])
    assert [(r.job_id, r.het_job_id, r.het_offset, r.state) for r in records] == [
        (12, 12, 0, "PENDING"),
        (12, 12, 0, "COMPLETED"),
        (13, 12, 1, "COMPLETED"),
        (40, 40, 0, "FAILED"),
    ]
    now = {(r.job_id, r.state) for r in latest_per_component(records)}
    assert now == {(12, "COMPLETED"), (13, "COMPLETED"), (40, "FAILED")}
    assert len(seen) == 1 and transport.calls == {"slurmdb_jobs": 1}
    assert seen[0].url.params["step"] == "12,40"
    assert seen[0].url.params["skip_steps"] == "true"
    assert await transport.accounting([]) == []
    assert transport.calls == {"slurmdb_jobs": 1}


async def test_requeue_is_refused_without_a_request() -> None:
    transport = _transport(_never_called)
    with pytest.raises(BackendError) as err:
        await transport.requeue(8)
    assert not err.value.transient and "no requeue operation" in str(err.value)
    assert transport.calls == {}


async def test_the_client_is_made_lazily_and_closed_once() -> None:
    count = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal count
        count += 1
        return httpx.Response(503, content=json.dumps({"oops": True}).encode())

    transport = _transport(handler)
    await transport.aclose()  # nothing opened yet
    with pytest.raises(BackendError):
        await transport.queue()
    await transport.aclose()
    await transport.aclose()
    with pytest.raises(BackendError):
        await transport.queue()  # a fresh client after aclose
    await transport.aclose()
    assert count == 2 and transport.calls == {"jobs": 2}
