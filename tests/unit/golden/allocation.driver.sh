#!/bin/bash
# asupervisor app it-0001 (it), session svc:
# its replicas run as steps of allocation 1234, started from here (detached).
state=/state/logs/svc/it-0001/.asupervisor/driver
mkdir -p "$state"
exec >>"$state/driver.log" 2>&1 </dev/null
put() { printf '%s\n' "$2" >"$state/.$1.tmp" && mv -f "$state/.$1.tmp" "$state/$1"; }
put pid "$$ $(hostname)"
allocation=1234
attempt="${1:-0}"
max_retries=0
cancel=/state/logs/svc/it-0001/cancel.request
export SLURM_UNBUFFEREDIO=1
export ASUP_PYTHON="${ASUPERVISOR_PYTHON:-python3}"
# The allocation's nodes, given to the groups round robin (one node per replica,
# as the batch job's het groups get), unless cfg.nodelist placed them.
nodes=($(scontrol show hostnames "$(squeue -h -j "$allocation" -o %N)" 2>/dev/null))
cursor=0
pick() {  # sets picked (no subshell: the cursor moves on)
    local n="$1" out=() i
    picked=""
    [ "${#nodes[@]}" -gt 0 ] || return 0
    for ((i = 0; i < n; i++)); do out+=("${nodes[(cursor + i) % ${#nodes[@]}]}"); done
    cursor=$(((cursor + n) % ${#nodes[@]}))
    local IFS=,; picked="--nodelist=${out[*]}"
}
pick 1; place0="$picked"
pick 2; place1="$picked"
put g0.nodes "${place0#--nodelist=}"
put g1.nodes "${place1#--nodelist=}"
# Rank 0's host: the first node of group 0.
rank0="${place0#--nodelist=}"
rank0="${rank0%%,*}"
export TORCHX_RANK0_HOST="${rank0:-${nodes[0]:-}}"
export ASUPERVISOR_RANK0_HOST="$TORCHX_RANK0_HOST"

pids=()
stopping=0
stop_steps() { local p; for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; }
trap 'stopping=1; stop_steps' TERM INT HUP
code=0
why=""
while :; do
    if [ -e "$cancel" ] || [ "$stopping" = 1 ]; then code=143; why=cancelled; break; fi
    # The allocation must still run (a retry after it ended would only fail).
    now=$(squeue -h -j "$allocation" -o %T 2>&1 | head -n 1)
    if [ "$now" != RUNNING ] &&
        [[ -z "$now" || "$now" == *"Invalid job id"* || "$now" =~ ^[A-Z_]+$ ]]; then
        code=1; why="allocation $allocation ended (${now:-gone})"; break
    fi
    export ASUPERVISOR_ATTEMPT="$attempt"
    put attempt "$attempt"
    pids=()
    srun --jobid=1234 --overlap --nodes=1 --ntasks=1 --chdir=/home/me/p --kill-on-bad-exit=1 --output=/state/logs/svc/it-0001/ps/0/launcher.log --open-mode=append --job-name=asupervisor:svc/it-0001:g0:a"$attempt" ${place0:+"$place0"} \
        env -- PYTHONUNBUFFERED=1 TORCHELASTIC_ERROR_FILE=/state/logs/svc/it-0001/ps/0/error.json PET_LOG_DIR=/state/logs/svc/it-0001/ps/0 ASUPERVISOR_APP_ID=it-0001 ASUPERVISOR_SESSION=svc ASUPERVISOR_ROLE=ps ASUPERVISOR_REPLICA_ID=0 ASUPERVISOR_NUM_REPLICAS=1 "$ASUP_PYTHON" -S /state/logs/svc/it-0001/.asupervisor/run_pump.py /state/logs/svc/it-0001/ps/0 -- python -m ps '$(id) '"'"'q'"'"'' &
    pids+=($!)
    srun --jobid=1234 --overlap --nodes=2 --ntasks-per-node=2 --chdir=/home/me/p --kill-on-bad-exit=1 --output=/state/logs/svc/it-0001/w/launcher.log --open-mode=append --job-name=asupervisor:svc/it-0001:g1:a"$attempt" ${place1:+"$place1"} \
        sh -c 'case "$SLURM_PROCID" in
0) exec env -- PYTHONUNBUFFERED=1 TORCHELASTIC_ERROR_FILE=/state/logs/svc/it-0001/w/0/error.json PET_LOG_DIR=/state/logs/svc/it-0001/w/0 ASUPERVISOR_APP_ID=it-0001 ASUPERVISOR_SESSION=svc ASUPERVISOR_ROLE=w ASUPERVISOR_REPLICA_ID=0 ASUPERVISOR_NUM_REPLICAS=4 "$ASUP_PYTHON" -S /state/logs/svc/it-0001/.asupervisor/run_pump.py /state/logs/svc/it-0001/w/0 -- python ;;
1) exec env -- PYTHONUNBUFFERED=1 TORCHELASTIC_ERROR_FILE=/state/logs/svc/it-0001/w/1/error.json PET_LOG_DIR=/state/logs/svc/it-0001/w/1 ASUPERVISOR_APP_ID=it-0001 ASUPERVISOR_SESSION=svc ASUPERVISOR_ROLE=w ASUPERVISOR_REPLICA_ID=1 ASUPERVISOR_NUM_REPLICAS=4 "$ASUP_PYTHON" -S /state/logs/svc/it-0001/.asupervisor/run_pump.py /state/logs/svc/it-0001/w/1 -- python ;;
2) exec env -- PYTHONUNBUFFERED=1 TORCHELASTIC_ERROR_FILE=/state/logs/svc/it-0001/w/2/error.json PET_LOG_DIR=/state/logs/svc/it-0001/w/2 ASUPERVISOR_APP_ID=it-0001 ASUPERVISOR_SESSION=svc ASUPERVISOR_ROLE=w ASUPERVISOR_REPLICA_ID=2 ASUPERVISOR_NUM_REPLICAS=4 "$ASUP_PYTHON" -S /state/logs/svc/it-0001/.asupervisor/run_pump.py /state/logs/svc/it-0001/w/2 -- python ;;
3) exec env -- PYTHONUNBUFFERED=1 TORCHELASTIC_ERROR_FILE=/state/logs/svc/it-0001/w/3/error.json PET_LOG_DIR=/state/logs/svc/it-0001/w/3 ASUPERVISOR_APP_ID=it-0001 ASUPERVISOR_SESSION=svc ASUPERVISOR_ROLE=w ASUPERVISOR_REPLICA_ID=3 ASUPERVISOR_NUM_REPLICAS=4 "$ASUP_PYTHON" -S /state/logs/svc/it-0001/.asupervisor/run_pump.py /state/logs/svc/it-0001/w/3 -- python ;;
*) echo "asupervisor: no replica for task $SLURM_PROCID" >&2; exit 1 ;;
esac' &
    pids+=($!)
    ended=()
    left=${#pids[@]}
    failed=0
    while [ "$left" -gt 0 ]; do
        for i in "${!pids[@]}"; do
            [ -z "${ended[$i]:-}" ] || continue
            ! kill -0 "${pids[$i]}" 2>/dev/null || continue
            wait "${pids[$i]}"
            rc=$?
            ended[$i]="$rc"
            left=$((left - 1))
            put "a$attempt.g$i.rc" "$rc"
            echo "asupervisor: attempt $attempt: group $i: srun exited with code $rc"
            if [ "$rc" -ne 0 ] && [ "$failed" = 0 ]; then
                failed=1; code="$rc"; stop_steps  # the gang stops with its first failure
            fi
        done
        if [ "$left" -gt 0 ]; then sleep 1 & wait $! 2>/dev/null; fi
    done
    if [ "$failed" = 0 ]; then code=0; break; fi
    if [ -e "$cancel" ] || [ "$stopping" = 1 ]; then why=cancelled; break; fi
    if [ "$attempt" -ge "$max_retries" ]; then break; fi
    attempt=$((attempt + 1))
done
why="${why//[^A-Za-z0-9 ._:()-]/ }"
put done "{\"attempt\": $attempt, \"code\": $code, \"why\": \"$why\"}"
exit "$code"
