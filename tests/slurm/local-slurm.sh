#!/usr/bin/env bash
# A single-node SLURM on localhost for tests: `local-slurm.sh up DIR` / `local-slurm.sh down DIR`.
#
# Partitions: debug (the default, no time limit), gpu (no limit), short (MaxTime 20 minutes) and shared (two jobs may
# share a core: a driver and two training cells on this machine's two); EnforcePartLimits=ALL
# refuses at submission a job asking more than its partition allows, as many clusters do. The node declares 4 GPUs.
#
# up: (re)starts from nothing in DIR: stops what an earlier `up` there started and removes its state;
#     installs Debian's slurm-wlm, slurmdbd, munge and mariadb-server if missing, writes every configuration,
#     state, socket, pid and log file under DIR, starts munged, mariadbd (socket only, no networking), slurmdbd,
#     slurmctld and slurmd without systemd, registers a cluster, an account and the current user with sacctmgr
#     (so that `sacct`, which Snakemake's SLURM executor uses for job status, works as on a real cluster), and
#     waits until the node is idle. Prints the environment to source: SLURM_CONF (and the munge socket).
#     /etc/slurm/slurm.conf is linked to DIR/slurm.conf if (and only if) no such file exists: the nested srun
#     of Snakemake's job step drops SLURM_CONF and reads the default path.
# down: stops only the daemons that `up` started, by the PIDs recorded in DIR/pids, removes the link it made,
#     and leaves the rest alone.
#
# Needs root (apt-get, daemons). Bounded: every wait has a deadline and fails with the daemon's log.
set -euo pipefail

command=${1:?usage: local-slurm.sh up|down DIR}
base=${2:?usage: local-slurm.sh up|down DIR}
base=$(realpath -m "$base")
pids="$base/pids"
munge_socket=/run/munge/munge.socket.2
# The node's simulated GPUs (GRES backed by empty files: jobs get SLURM's GPU allocation, no device), and the MaxTime
# in minutes of the `short` partition (a time limit a retry must fit).
GPUS=4
SHORT_MAXTIME=20

die() {
    echo "local-slurm: $*" >&2
    for log in "$base"/log/*.log; do [ -f "$log" ] && { echo "--- $log" >&2; tail -n 20 "$log" >&2; }; done
    exit 1
}

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "timed out waiting for $what"
        sleep 0.5
    done
}

start() { # start NAME COMMAND...: run a daemon in the foreground mode, in the background, record its PID
    local name=$1
    shift
    "$@" >"$base/log/$name.out" 2>&1 &
    echo "$name $!" >>"$pids"
}

down() {
    [ -f "$pids" ] || return 0
    # Reverse order of start; SIGTERM, then SIGKILL whatever is still there after 5 s.
    tac "$pids" | while read -r name pid; do kill "$pid" 2>/dev/null || true; done
    for _ in $(seq 10); do
        alive=0
        while read -r name pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$pids"
        [ "$alive" = 0 ] && break
        sleep 0.5
    done
    while read -r name pid; do kill -9 "$pid" 2>/dev/null || true; done <"$pids"
    rm -f "$pids"
    if [ -f "$base/links" ]; then
        while read -r link; do [ "$(readlink "$link")" = "$base/slurm.conf" ] && rm -f "$link"; done <"$base/links"
        rm -f "$base/links"
    fi
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurm-wlm)
    command -v slurmdbd >/dev/null || missing+=(slurmdbd)
    command -v munged >/dev/null || missing+=(munge)
    command -v mariadbd >/dev/null || missing+=(mariadb-server)
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "local-slurm: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d: the packages' post-install scripts must not start system-wide daemons.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    rm -f /usr/sbin/policy-rc.d
}

write_configs() {
    local host node_line user
    host=$(hostname)
    user=$(id -un)
    node_line=$(slurmd -C | head -n 1)
    cat >"$base/slurm.conf" <<EOF
ClusterName=klstudy
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
# A requeued job (a training cell's next slice, a preempted job) waits cred_expire before it may start again: 120 s by
# default, 10 here so that the tests of slices do not wait.
AuthInfo=cred_expire=10
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MailProg=/bin/true
SlurmctldPort=16817
SlurmdPort=16818
SlurmctldPidFile=$base/run/slurmctld.pid
SlurmdPidFile=$base/run/slurmd.pid
SlurmdSpoolDir=$base/spool/slurmd
StateSaveLocation=$base/spool/slurmctld
SlurmctldLogFile=$base/log/slurmctld.log
SlurmdLogFile=$base/log/slurmd.log
SchedulerType=sched/backfill
SchedulerParameters=defer_batch
MinJobAge=600
KillWait=5
OverTimeLimit=0
InactiveLimit=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=16819
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
GresTypes=gpu
EnforcePartLimits=ALL
$node_line Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=ALL MaxTime=INFINITE State=UP
PartitionName=short Nodes=ALL MaxTime=$SHORT_MAXTIME State=UP
PartitionName=shared Nodes=ALL MaxTime=INFINITE OverSubscribe=FORCE:2 State=UP
EOF
    # GPUs without devices: SLURM 22.05 needs a File= per GPU (a Count= alone drains the node, "gres/gpu count
    # reported lower than configured"); empty regular files will do, with detection off.
    mkdir -p "$base/gpus"
    for i in $(seq 0 $((GPUS - 1))); do : >"$base/gpus/nvidia$i"; done
    printf 'AutoDetect=off\nName=gpu File=%s/gpus/nvidia[0-%d]\n' "$base" $((GPUS - 1)) >"$base/gres.conf"
    cat >"$base/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=16819
SlurmUser=$user
PidFile=$base/run/slurmdbd.pid
LogFile=$base/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$user
StorageLoc=klstudy_slurm_acct_db
EOF
    chmod 600 "$base/slurmdbd.conf"
}

up() {
    [ "$(id -u)" = 0 ] || die "needs root (apt-get and the daemons)"
    [ -f "$pids" ] && down
    # A fresh start: no database, job state or logs of an earlier cluster in DIR (only what `up` creates).
    rm -rf "$base"/{log,run,spool,munge,mysql,gpus,slurm.conf,gres.conf,slurmdbd.conf,install-mariadb.out}
    install_packages
    mkdir -p "$base"/{log,run,spool/slurmd,spool/slurmctld,munge,mysql}
    : >"$pids"
    write_configs

    # munge: its own key under $base (run as root with --force, as $base may sit in a directory only root
    # can enter). The socket is munge's default (/run/munge), because SLURM's client commands only look there;
    # an existing munged is left alone.
    [ -S "$munge_socket" ] && munge -n >/dev/null 2>&1 && die "a munged is already running ($munge_socket)"
    mkdir -p "$(dirname "$munge_socket")"
    chmod 700 "$base/munge"
    dd if=/dev/urandom bs=1 count=1024 of="$base/munge/munge.key" status=none
    chmod 400 "$base/munge/munge.key"
    start munged munged --foreground --force --key-file="$base/munge/munge.key" \
        --socket="$munge_socket" --pid-file="$base/munge/munged.pid" \
        --log-file="$base/log/munged.log" --seed-file="$base/munge/munged.seed"
    wait_for 20 munged munge -n

    # MariaDB for slurmdbd: a fresh data directory, a socket, no TCP.
    mariadb-install-db --no-defaults --datadir="$base/mysql" --user="$(id -un)" --auth-root-authentication-method=socket \
        >"$base/install-mariadb.out" 2>&1 || die "mariadb-install-db failed (see $base/install-mariadb.out)"
    start mariadbd mariadbd --no-defaults --datadir="$base/mysql" --socket="$base/run/mysql.sock" \
        --skip-networking --user="$(id -un)" --pid-file="$base/run/mariadbd.pid" --log-error="$base/log/mariadbd.log"
    wait_for 60 mariadbd mariadb --no-defaults --socket="$base/run/mysql.sock" -e "select 1"

    # Every SLURM program finds its configuration through SLURM_CONF (slurmdbd.conf beside slurm.conf);
    # slurmdbd reaches MariaDB through libmariadb's default socket, which MYSQL_UNIX_PORT sets.
    export SLURM_CONF="$base/slurm.conf"
    # Snakemake's job step strips SLURM_* variables before its nested srun, which then reads the default
    # /etc/slurm/slurm.conf: point that at ours while the cluster is up (never over an existing file).
    if [ ! -e /etc/slurm/slurm.conf ]; then
        mkdir -p /etc/slurm && ln -s "$base/slurm.conf" /etc/slurm/slurm.conf && echo /etc/slurm/slurm.conf >"$base/links"
    elif [ "$(readlink /etc/slurm/slurm.conf)" != "$base/slurm.conf" ]; then
        die "/etc/slurm/slurm.conf exists (a real cluster's?): not touching it"
    fi
    start slurmdbd env MYSQL_UNIX_PORT="$base/run/mysql.sock" slurmdbd -D
    wait_for 60 slurmdbd bash -c "exec 3<>/dev/tcp/127.0.0.1/16819"

    # The cluster must exist in the database before slurmctld registers with it.
    sacctmgr -i add cluster klstudy >"$base/log/sacctmgr.log" 2>&1 || die "sacctmgr add cluster failed"
    sacctmgr -i add account klstudy Cluster=klstudy Description=tests Organization=tests >>"$base/log/sacctmgr.log" 2>&1
    sacctmgr -i add user "$(id -un)" Account=klstudy DefaultAccount=klstudy >>"$base/log/sacctmgr.log" 2>&1
    start slurmctld slurmctld -D -i -f "$base/slurm.conf"
    wait_for 60 slurmctld scontrol ping
    start slurmd slurmd -D -f "$base/slurm.conf"
    wait_for 60 "an idle node" bash -c "sinfo -h -o %t | grep -qx idle"
    wait_for 60 "accounting (sacct)" sacct -n -X
    echo "export SLURM_CONF=$base/slurm.conf"
}

case "$command" in
up) up ;;
down) down ;;
*) die "unknown command $command (up or down)" ;;
esac
