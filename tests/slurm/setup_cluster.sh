#!/usr/bin/env bash
# Start a one-node Slurm cluster on localhost (Debian 12, as root, no systemd needed) for testing
# the workflow's Slurm profile: slurm-wlm 22.05 and munge from Debian, no accounting database (the
# profile polls job state with squeue), no cgroups, and a stand-in GPU (gres gpu:1 backed by
# /dev/null) so that GPU requests are accepted. State, spool, logs and PID files live under
# $SLURM_TEST_DIR.
#
# slurm.conf and gres.conf go to /etc/slurm, Slurm's default location, not to a temporary folder:
# snakemake-executor-plugin-slurm-jobstep removes every SLURM_* variable (SLURM_CONF included)
# before its `srun` inside a job, so that srun only finds a config at the default path.
# A slurm.conf there that this script did not write is never overwritten.
#
#   tests/slurm/setup_cluster.sh          # start it (idempotent); the daemons keep running
#   tests/slurm/setup_cluster.sh --stop   # stop the daemons this script started
set -euo pipefail

SLURM_TEST_DIR=${SLURM_TEST_DIR:-/tmp/bfspo-slurm}
CONF_DIR=/etc/slurm
SLURM_CONF=$CONF_DIR/slurm.conf
MARK="# written by bfspo tests/slurm/setup_cluster.sh"

stop_cluster() {
    local pidfile
    for pidfile in "$SLURM_TEST_DIR/run/slurmd.pid" "$SLURM_TEST_DIR/run/slurmctld.pid" "$SLURM_TEST_DIR/run/munged.pid"; do
        if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            kill "$(cat "$pidfile")"
        fi
        rm -f "$pidfile"
    done
}

if [[ ${1:-} == --stop ]]; then
    stop_cluster
    exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

if [[ -e $SLURM_CONF ]] && ! grep -qF "$MARK" "$SLURM_CONF"; then
    echo "setup_cluster: $SLURM_CONF exists and was not written by this script; not touching it" >&2
    exit 1
fi
mkdir -p "$SLURM_TEST_DIR"/{state,spool,log,run} "$CONF_DIR"

# munge: one key for the machine, the daemon running as the munge user.
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi
if ! munge -n </dev/null >/dev/null 2>&1; then
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid
    cp /run/munge/munged.pid "$SLURM_TEST_DIR/run/munged.pid"
fi

NODE=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(free -m | awk '/^Mem:/ {print $2}') - 2048 ))

cat >"$SLURM_CONF" <<CONF
$MARK
ClusterName=bfspo-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$SLURM_TEST_DIR/state
SlurmdSpoolDir=$SLURM_TEST_DIR/spool
SlurmctldPidFile=$SLURM_TEST_DIR/run/slurmctld.pid
SlurmdPidFile=$SLURM_TEST_DIR/run/slurmd.pid
SlurmctldLogFile=$SLURM_TEST_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_TEST_DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=300
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF

cat >"$CONF_DIR/gres.conf" <<CONF
$MARK
AutoDetect=off
NodeName=$NODE Name=gpu File=/dev/null
CONF

if ! scontrol ping >/dev/null 2>&1; then
    slurmctld -f "$SLURM_CONF"
fi
if ! pgrep -F "$SLURM_TEST_DIR/run/slurmd.pid" >/dev/null 2>&1; then
    slurmd -f "$SLURM_CONF"
fi

for _ in $(seq 30); do
    if sinfo -h -N -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
        break
    fi
    sleep 1
done
sinfo -N -o "%N %t %c %m %G"
if ! sinfo -h -N -o %t | grep -qE '^(idle|mix|alloc)'; then
    echo "setup_cluster: node $NODE did not come up; see $SLURM_TEST_DIR/log" >&2
    exit 1
fi
