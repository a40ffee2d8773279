"""Submit, wait, exit codes, the gang rule, retries by policy, and cancel, on every target."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, ReplicaState, RetryPolicy, SpecError, Supervisor, WaitTimeout

from .helpers import ME, TRAPS_TERM, WAIT_FOR, app, first_line, lines
from .target import Target

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_an_app_whose_replicas_exit_0_succeeds(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    say = f"echo hello from {ME}; exit 0"
    trainer = target.role("trainer", say, exchange=exchange, num_replicas=2)
    ps = target.role("ps", say, exchange=exchange)
    handle = await sv.submit(app(trainer, ps), target.backend, cfg)
    assert handle.startswith(f"{target.backend}://conf/conf-")
    status = await sv.wait(handle, timeout=target.timeout)
    assert status.state is AppState.SUCCEEDED, status
    assert status.num_restarts == 0
    for role, k in (("trainer", 0), ("trainer", 1), ("ps", 0)):
        replica = status.replica(role, k)
        assert replica is not None and replica.state is ReplicaState.SUCCEEDED, status
        assert replica.exit_code == 0
        assert await lines(sv, handle, role, k, streams="stdout") == [f"hello from {role}-{k}\n"]


async def test_a_failing_replica_fails_the_app_with_its_exit_code(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    script = 'if [ "$ASUPERVISOR_REPLICA_ID" = 1 ]; then echo bad >&2; exit 5; fi; exit 0'
    handle = await sv.submit(
        app(target.role("w", script, exchange=exchange, num_replicas=2)), target.backend, cfg
    )
    status = await sv.wait(handle, timeout=target.timeout)
    assert status.state is AppState.FAILED, status
    bad = status.replica("w", 1)
    assert bad is not None and bad.state is ReplicaState.FAILED and bad.exit_code == 5, status
    good = status.replica("w", 0)
    # It may have ended before the failure, or been stopped with the gang.
    assert good is not None and good.state in (ReplicaState.SUCCEEDED, ReplicaState.CANCELLED)
    assert status.msg, "a failed app says why"
    assert await lines(sv, handle, "w", 1, streams="stderr") == ["bad\n"]


async def test_a_failing_replica_stops_the_gang_and_nothing_keeps_running(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    # The others announce themselves, then would leave a mark if they lived 8 s more.
    # Only time lived counts: a stop may kill the `sleep` a moment before its shell,
    # which then still runs the next command (Slurm's linuxproc tracking signals the
    # step's processes one by one). Cut short, the shell exits 1, a stop's doing
    # (CANCELLED): a zero exit would be work finished (SUCCEEDED), as seen once in CI.
    # Three replicas in all: the local cluster has three nodes, one per Slurm het group.
    others = (
        f'touch "$CONF_DIR/up-"{ME}; up=$(date +%s); sleep 8; '
        f'[ $(( $(date +%s) - up )) -ge 7 ] || exit 1; touch "$CONF_DIR/survived-"{ME}; exit 0'
    )
    bad = WAIT_FOR + "wait_for up-slow-0; wait_for up-peer-0; exit 7"
    roles = [
        target.role("bad", bad, exchange=exchange),
        target.role("slow", others, exchange=exchange),
        target.role("peer", others, exchange=exchange),
    ]
    handle = await sv.submit(app(*roles), target.backend, cfg)
    status = await sv.wait(handle, timeout=target.timeout)
    assert status.state is AppState.FAILED, status
    failed = status.replica("bad", 0)
    assert failed is not None and failed.state is ReplicaState.FAILED and failed.exit_code == 7
    for role, k in (("slow", 0), ("peer", 0)):
        other = status.replica(role, k)
        assert other is not None and other.state is ReplicaState.CANCELLED, status
    # Nothing the gang stop missed may still run: wait out the time a survivor needed.
    ups = [await anyio.Path(exchange / f"up-{r}").stat() for r in ("slow-0", "peer-0")]
    await anyio.sleep(max(0.0, max(u.st_mtime for u in ups) + 9.0 - time.time()))
    survivors = [p.name async for p in anyio.Path(exchange).glob("survived-*")]
    assert survivors == []


# A replica waits for all others to be up; the first attempt of trainer/0 then fails.
# A later attempt of trainer/0 lets everyone finish. Each line says the attempt.
RETRY_SCRIPT = (
    WAIT_FOR + f'echo "attempt $ASUPERVISOR_ATTEMPT"; touch "$CONF_DIR/up-"{ME}; '
    'if [ "$ASUPERVISOR_ROLE-$ASUPERVISOR_REPLICA_ID" = trainer-0 ]; then '
    '  if [ "$ASUPERVISOR_ATTEMPT" = 0 ]; then '
    "    wait_for up-trainer-1; wait_for up-ps-0; exit 3; "
    '  fi; touch "$CONF_DIR/go"; exit 0; '
    "fi; wait_for go; exit 0"
)

# Which replicas a policy restarts when trainer/0 fails (trainer has 2 replicas, ps 1).
RESTARTED = {
    RetryPolicy.REPLICA: {("trainer", 0)},
    RetryPolicy.ROLE: {("trainer", 0), ("trainer", 1)},
    RetryPolicy.APPLICATION: {("trainer", 0), ("trainer", 1), ("ps", 0)},
}


@pytest.mark.parametrize("policy", list(RetryPolicy), ids=[p.value for p in RetryPolicy])
async def test_each_retry_policy_restarts_what_it_names_or_is_rejected(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path, policy: RetryPolicy
) -> None:
    trainer = target.role(
        "trainer",
        RETRY_SCRIPT,
        exchange=exchange,
        num_replicas=2,
        max_retries=1,
        retry_policy=policy,
    )
    ps = target.role("ps", RETRY_SCRIPT, exchange=exchange, max_retries=1, retry_policy=policy)
    spec = app(trainer, ps)
    caps = sv.backend(target.backend).capabilities
    if policy not in caps.retry_policies:
        # Declared as impossible: both entry points refuse it and name the field.
        with pytest.raises(SpecError) as refused:
            sv.dryrun(spec, target.backend, cfg)
        assert "roles[0].retry_policy" in refused.value.fields, refused.value
        with pytest.raises(SpecError, match=r"roles\[0\]\.retry_policy"):
            await sv.submit(spec, target.backend, cfg)
        assert await sv.list(target.backend) == []
        return
    handle = await sv.submit(spec, target.backend, cfg)
    status = await sv.wait(handle, timeout=target.timeout * 2)
    assert status.state is AppState.SUCCEEDED, status
    assert status.num_restarts == 1, status  # one failure, one restart of the policy's scope
    for role, k in (("trainer", 0), ("trainer", 1), ("ps", 0)):
        replica = status.replica(role, k)
        assert replica is not None and replica.state is ReplicaState.SUCCEEDED, status
        restarted = (role, k) in RESTARTED[policy]
        assert replica.restarts == int(restarted), (role, k, status)
        expected = ["attempt 0\n", "attempt 1\n"] if restarted else ["attempt 0\n"]
        assert await lines(sv, handle, role, k, streams="stdout") == expected, (role, k)


async def test_a_replica_failing_past_its_retries_fails_the_app(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    caps = sv.backend(target.backend).capabilities
    if not caps.retry_policies:
        with pytest.raises(SpecError, match="max_retries"):
            sv.dryrun(
                app(target.role("w", "exit 4", exchange=exchange, max_retries=1)),
                target.backend,
                cfg,
            )
        return
    policy = sorted(caps.retry_policies)[0]
    script = 'echo "attempt $ASUPERVISOR_ATTEMPT"; exit 4'
    role = target.role("w", script, exchange=exchange, max_retries=1, retry_policy=policy)
    handle = await sv.submit(app(role), target.backend, cfg)
    status = await sv.wait(handle, timeout=target.timeout * 2)
    assert status.state is AppState.FAILED, status
    assert status.num_restarts == 1, status
    replica = status.replica("w", 0)
    assert replica is not None and replica.exit_code == 4 and replica.restarts == 1, status
    assert await lines(sv, handle, "w", 0, streams="stdout") == ["attempt 0\n", "attempt 1\n"]


async def test_cancel_stops_a_running_app_after_its_grace_period(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    role = target.role("r", TRAPS_TERM, exchange=exchange, num_replicas=2)
    handle = await sv.submit(app(role), target.backend, cfg)
    with anyio.fail_after(target.timeout):
        assert await first_line(sv, handle, "r", 1) == "ready\n"
    with pytest.raises(WaitTimeout):
        await sv.wait(handle, timeout=0.2)
    await sv.cancel(handle)
    await sv.cancel(handle)  # idempotent
    status = await sv.wait(handle, timeout=target.timeout)
    assert status.state is AppState.CANCELLED, status
    # This process's own cancel, never told as another's (Docker's watch of the request
    # file saw the owner's own request first, about one time in six).
    assert status.msg == "cancelled by request", status
    assert status.num_restarts == 0
    replica = status.replica("r", 1)
    assert replica is not None and replica.state is ReplicaState.CANCELLED, status
    # SIGTERM came first and the replica had time to say so before it exited.
    assert await lines(sv, handle, "r", 1, streams="stdout") == ["ready\n", "got TERM\n"]
    await sv.cancel(handle)  # and still fine once it ended
    assert (await sv.wait(handle)).state is AppState.CANCELLED
