#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, to check `srun` launches (docs/cli.md, "Under Slurm").
#
#   scripts/slurm-local.sh start   # writes $PIPEFILL_SLURM_DIR/slurm.conf, starts munged, slurmctld, slurmd
#   export SLURM_CONF=$PIPEFILL_SLURM_DIR/slurm.conf   # (the script prints this line)
#   srun --mpi=pmix -n 4 target/release/pipefill train --launcher mpi --ranks 2 --data-parallel 2
#   scripts/slurm-local.sh stop
#
# Needs root and Debian's packages `slurmd slurmctld slurm-client munge` (with OpenMPI's PMIx);
# PIPEFILL_SLURM_DIR defaults to /tmp/pipefill-slurm. The node claims 8 CPUs whatever the machine has
# (`config_overrides`), so a 2-core machine can start 4 ranks.
set -euo pipefail
dir=${PIPEFILL_SLURM_DIR:-/tmp/pipefill-slurm}
conf=$dir/slurm.conf
host=$(hostname -s)

start() {
    for tool in munged slurmctld slurmd srun sinfo; do
        command -v "$tool" >/dev/null || { echo "slurm-local: $tool not found (apt-get install slurmd slurmctld slurm-client munge)" >&2; exit 2; }
    done
    mkdir -p "$dir/ctld" "$dir/d"
    cat >"$conf" <<CONF
ClusterName=pipefill
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
NodeName=$host CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    mkdir -p /run/munge
    chown munge:munge /run/munge 2>/dev/null || true
    pgrep -x munged >/dev/null || munged --force 2>/dev/null || runuser -u munge -- munged
    export SLURM_CONF=$conf
    pgrep -x slurmctld >/dev/null || slurmctld -f "$conf"
    pgrep -x slurmd >/dev/null || slurmd -f "$conf"
    for _ in $(seq 1 30); do
        if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "export SLURM_CONF=$conf"
            return 0
        fi
        sleep 1
    done
    echo "slurm-local: the node did not become idle in 30 s; logs in $dir" >&2
    sinfo >&2 || true
    exit 1
}

stop() {
    pkill -x slurmd || true
    pkill -x slurmctld || true
    for _ in $(seq 1 20); do
        pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || return 0
        sleep 0.5
    done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) echo "usage: scripts/slurm-local.sh start|stop" >&2; exit 2 ;;
esac
