#!/usr/bin/env bash
# ctest entry matrix_slurm: slurm.sh ARBITER. Starts a real single-node Slurm (munged,
# slurmctld, slurmd, all configured in a temporary directory, loopback only), submits a matrix
# through `arbiter matrix plan --slurm` and its submit.sh, waits for the report job and checks
# the report: every comparison made, none MISSING. The matrix run is matrix/default.toml's
# models, corpus, shapes and controls with its cpu-side arms only: the node's one GPU is
# /dev/null in gres.conf, not a device, so cuda traces would fail there. That GPU lets
# slurmctld accept (sbatch --test-only) every script of the default matrix's own plan,
# its --gres=gpu:1 array included.
# SKIP (exit 77) only when Slurm or munge is not installed or its daemons cannot start here;
# every daemon it starts is stopped on exit. The temporary directory is kept on failure.
set -euo pipefail
arbiter="$(realpath "$1")"
root="$(cd "$(dirname "$0")/../.." && pwd)"
skip() { echo "SKIP: $*"; exit 77; }
for b in munged munge unmunge slurmctld slurmd sbatch sinfo squeue scontrol scancel python3; do
  command -v "$b" >/dev/null ||
    skip "$b not found (scripts/install-deps.sh installs slurm-wlm, munge and python3)"
done

tmp="$(mktemp -d /tmp/arbiter-slurm.XXXXXX)"
chmod 700 "$tmp"
pids=()
ok=0
t_start=$SECONDS
cleanup() {
  # Jobs first (slurmstepd outlives slurmd), then the daemons this script started, by pid.
  if [ -n "${SLURM_CONF:-}" ] && [ ${#pids[@]} -ge 2 ]; then
    scancel --quiet --full "--user=$(id -un)" 2>/dev/null || true
    for _ in $(seq 30); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 1; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ "$ok" = 1 ]; then rm -rf "$tmp"; else echo "matrix_slurm: logs kept in $tmp" >&2; fi
}
trap cleanup EXIT
log_tail() { for f in "$@"; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# wait_for SECONDS WHAT CMD...: polls CMD every half second; 1 when the time runs out.
wait_for() {
  local deadline=$((SECONDS + $1)) what="$2"
  shift 2
  until "$@"; do
    [ $SECONDS -lt $deadline ] || { echo "matrix_slurm: timed out waiting for $what" >&2; return 1; }
    sleep 0.5
  done
}

# munge: a key of its own and its own socket, pid, seed and log files.
mkdir -m 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
sock="$tmp/munge/munge.socket"
munged -F --force --key-file="$tmp/munge/munge.key" --socket="$sock" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
  --log-file="$tmp/munge/munged.log" >"$tmp/munge/munged.out" 2>&1 &
pids+=($!)
munge_ok() { munge -n -S "$sock" 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1; }
wait_for 20 "munged" munge_ok || { log_tail "$tmp/munge/munged.log"; skip "munged does not start here"; }

# slurm: one node, this machine's CPUs and memory as slurmd measures them, free ports.
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/log"
node="$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]*/NodeName=localhost NodeAddr=127.0.0.1/')"
echo "NodeName=localhost Name=gpu File=/dev/null" >"$tmp/gres.conf"
user="$(id -un)"
: >"$tmp/plugstack.conf"
cat >"$tmp/slurm.conf" <<EOF
ClusterName=arbiter-test
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
MpiDefault=none
GresTypes=gpu
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
PlugStackConfig=$tmp/plugstack.conf
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/log/slurmctld.pid
SlurmdPidFile=$tmp/log/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
$node Gres=gpu:1 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$tmp/slurm.conf"
slurmctld -D -i >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
node_idle() { [ "$(sinfo -h -N -n localhost -o %T 2>/dev/null)" = idle ]; }
if ! wait_for 60 "the node to be idle" node_idle; then
  sinfo -N -l 2>&1 || true
  log_tail "$tmp/log/slurmctld.out" "$tmp/log/slurmctld.log" "$tmp/log/slurmd.out" "$tmp/log/slurmd.log"
  skip "slurmctld/slurmd do not bring a node up here"
fi
echo "matrix_slurm: Slurm up in $((SECONDS - t_start)) s"

cat >"$tmp/cpu.toml" <<'EOF'
question = "Does arbiter's cpu tier compute the same model as its f64 reference tier (through Slurm)?"
corpus = "models/corpus/stories.txt"
models = ["models/TinyStories-656K"]
shapes = ["w1", "w8", "w256"]
allow_long_context = true
topk = 8
decided = 2.0
reference = "ref"
candidates = ["cpu"]
[arms.ref]
device = "ref"
[arms.cpu]
device = "cpu"
[controls]
aa = ["ref"]
noise_floor = [["ref", "cpu"]]
EOF
cd "$root"
default="$("$arbiter" matrix plan matrix/default.toml -o "$tmp/default" --slurm)"
grep -q -- '--gres=gpu:1' "$(dirname "$default")/traces-gpu1.sbatch"
for f in "$(dirname "$default")"/*.sbatch; do
  sbatch --test-only "$f" >/dev/null 2>&1 || { sbatch --test-only "$f"; echo "FAIL: slurmctld refuses $f"; exit 1; }
done
out="$tmp/out"
submit="$("$arbiter" matrix plan "$tmp/cpu.toml" -o "$out" --slurm)"
[ "$submit" = "$out/slurm/submit.sh" ] || { echo "FAIL: plan printed '$submit'"; exit 1; }
"$submit"
report_job="$(awk -F'\t' '$1 == "report" {print $2}' "$out/slurm/jobs.txt")"
job_state() { scontrol show job -o "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
report_done() { case "$(job_state "$report_job")" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) true ;; *) false ;; esac; }
if ! wait_for 900 "report job $report_job" report_done; then
  squeue -l || true
  log_tail "$tmp/log/slurmctld.log" "$tmp/log/slurmd.log" "$out"/slurm/logs/*
  exit 1
fi
echo "matrix_slurm: report job $report_job $(job_state "$report_job") after $((SECONDS - t_start)) s"
fail() { echo "FAIL: $*"; log_tail "$out"/slurm/logs/*; exit 1; }
[ -f "$out/report.md" ] || fail "no $out/report.md"
! grep -n "MISSING" "$out/report.md" || fail "the report lists MISSING rows"
# 3 shapes x (ref, ref A/A, cpu) traces, one log per array task.
n_traces="$(ls "$out/traces" | grep -c '\.tsv$')"
[ "$n_traces" = 9 ] || fail "expected 9 traces, found $n_traces"
n_logs="$(ls "$out/slurm/logs" | grep -c '^arbiter-out-cpu-')"
[ "$n_logs" = 9 ] || fail "expected 9 task logs, found $n_logs"
[ "$(job_state "$report_job")" = COMPLETED ] || fail "report job ended $(job_state "$report_job") (exit = verdict)"
grep -q "VERDICT: pass" "$out"/slurm/logs/arbiter-out-report-*.out || fail "no pass verdict in the report job's log"
echo "PASS: matrix through Slurm in $((SECONDS - t_start)) s, report $out/report.md"
ok=1
