# SPDX-License-Identifier: Apache-2.0
# A cluster of "hosts" on one machine: each host is a network namespace, joined by a veth pair
# to a bridge that lives in its own namespace (nothing is added to the root namespace). Open MPI
# runs across them over TCP, launched by an rsh agent that executes its command inside the
# host's namespace. Source this file; see tests/cluster/README.md.
#
#   cluster_up H            create H hosts: namespaces ${CLUSTER_PREFIX}-h0.., addresses 10.77.0.10+i
#                           (exit 77 when network namespaces cannot be made here: tests Skip)
#   cluster_down            remove everything cluster_up made (also run from a trap on EXIT/INT/TERM)
#   cluster_hostfile F S    write an Open MPI hostfile F: every host with S slots
#   cluster_mpirun ARGS...  mpirun inside host 0 with the harness's options (cluster_mca_args)
#   cluster_exec I CMD...   run CMD inside host I's namespace (hostname: the namespace's name)
#   cluster_wait_for P PID  wait until path P exists or process PID ended (60 s at most)
#   cluster_kill_host I     kill -9 every process whose network namespace is host I's
#   cluster_kill_program I PROGRAM  kill -9 host I's processes running PROGRAM (its daemon lives)
#   cluster_link I up|down  bring host I's link up or down (down: a partition)
#   cluster_limit I RATE [BURST]  limit host I's link to RATE (tc tbf), e.g. 100mbit
#   cluster_check_orted     an orted in every host connects back to mpirun in host 0
# CLUSTER_MCA (array): the mpirun options of the harness (agent, TCP interfaces, binding).

CLUSTER_PREFIX=${CLUSTER_PREFIX:-loomcl}
CLUSTER_NET=10.77.0
CLUSTER_HOSTS=0
CLUSTER_DIR=""
CLUSTER_MCA=()

cluster_ns() { echo "${CLUSTER_PREFIX}-h$1"; }
cluster_addr() { echo "${CLUSTER_NET}.$((10 + $1))"; }

# Removes every namespace with the prefix (this run's, or a crashed run's), which takes their
# veths with them (the bridge lives in one of them), and the work directory.
cluster_down() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${CLUSTER_PREFIX}-(h[0-9]+|br)$"); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  [ -d /etc/netns ] && rmdir /etc/netns 2>/dev/null
  # Open MPI's session directories of the hosts (named by their hostnames), which a killed
  # host's daemon leaves behind.
  rm -rf "${TMPDIR:-/tmp}/ompi.${CLUSTER_PREFIX}-h"[0-9]*
  if [ -n "$CLUSTER_DIR" ] && [ -d "$CLUSTER_DIR" ]; then rm -rf "$CLUSTER_DIR"; fi
  CLUSTER_HOSTS=0
  return 0
}

cluster_trap() {
  local status=$?
  cluster_down
  exit "$status"
}

cluster_skip() {
  echo "SKIP: $*"
  cluster_down
  exit 77
}

cluster_up() {
  local hosts=$1 i ns
  trap cluster_trap EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  cluster_down  # a previous run that crashed may have left its namespaces
  # Try, rather than guess, whether this machine lets us make namespaces and veths.
  command -v ip > /dev/null || cluster_skip "no ip(8) here (iproute2)"
  ip netns add "${CLUSTER_PREFIX}-br" 2> /tmp/loomcl.$$.err ||
    cluster_skip "cannot create a network namespace: $(cat /tmp/loomcl.$$.err) (needs root or CAP_NET_ADMIN)"
  rm -f /tmp/loomcl.$$.err
  ip -n "${CLUSTER_PREFIX}-br" link add br0 type bridge 2> /dev/null ||
    cluster_skip "cannot create a bridge inside a network namespace"
  ip -n "${CLUSTER_PREFIX}-br" link set br0 up
  ip -n "${CLUSTER_PREFIX}-br" link set lo up
  CLUSTER_DIR=$(mktemp -d /tmp/loomcl.XXXXXX)
  for ((i = 0; i < hosts; i++)); do
    ns=$(cluster_ns $i)
    ip netns add "$ns" || cluster_skip "cannot create network namespace $ns"
    # The veth pair is made in the bridge's namespace with its peer put straight into the host's:
    # it never exists in the root namespace.
    ip -n "${CLUSTER_PREFIX}-br" link add "v$i" type veth peer name eth0 netns "$ns" ||
      cluster_skip "cannot create a veth pair between namespaces"
    ip -n "${CLUSTER_PREFIX}-br" link set "v$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(cluster_addr $i)/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  CLUSTER_HOSTS=$hosts
  # The rsh agent: Open MPI calls it as `agent HOST COMMAND...` (HOST an address of the hostfile)
  # and it runs COMMAND, a shell command line, inside that host's namespace — and its own UTS
  # namespace, whose hostname is the namespace's name: each host has a name of its own, as real
  # hosts do, so that what loom decides by hostname (a peer on this host, whose death /proc
  # shows at once and which a survivor may fence) holds only inside one host.
  {
    echo '#!/bin/sh'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for ((i = 0; i < hosts; i++)); do echo "  $(cluster_addr $i)) ns=$(cluster_ns $i) ;;"; done
    echo '  *) echo "rsh agent: no host $host in this cluster" >&2; exit 255 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" unshare --uts sh -c '"'"'hostname "$0" && exec sh -c "$1"'"'"' "$ns" "$*"'
  } > "$CLUSTER_DIR/rsh-agent"
  chmod +x "$CLUSTER_DIR/rsh-agent"
  # mpi_yield_when_idle: the hosts share this machine's cores, so a hostfile's slots (2 per host)
  # oversubscribe them without Open MPI knowing; a rank that busy-polls for a message then holds
  # the core its peer needs to send it. Measured on 2 x 2 ranks, 2 cores: a 64 KiB allreduce
  # 10.7 ms busy-polling, 0.25 ms yielding (tests/cluster/README.md).
  # No mpi_preconnect_mpi: it only made rarer a survivor killed by SIGPIPE writing to the dead
  # host's socket, which loom's failure detection ignores (docs/fault-tolerance.md, "Open MPI
  # and SIGPIPE"); without it CTest runs what a user's TCP cluster runs.
  CLUSTER_MCA=(--mca plm_rsh_agent "$CLUSTER_DIR/rsh-agent" --mca plm_rsh_no_tree_spawn 1
               --mca btl tcp,self --mca btl_tcp_if_include "${CLUSTER_NET}.0/24"
               --mca oob_tcp_if_include "${CLUSTER_NET}.0/24" --bind-to none
               --mca mpi_yield_when_idle 1)
  return 0
}

cluster_hostfile() {
  local file=$1 slots=$2 i
  : > "$file"
  for ((i = 0; i < CLUSTER_HOSTS; i++)); do echo "$(cluster_addr $i) slots=$slots" >> "$file"; done
}

cluster_exec() {  # inside host I's network namespace, with its hostname (as the rsh agent)
  local i=$1
  shift
  ip netns exec "$(cluster_ns "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(cluster_ns "$i")" "$@"
}

cluster_mpirun() {
  cluster_exec 0 mpirun --allow-run-as-root "${CLUSTER_MCA[@]}" "$@"
}

# Waits until PATH exists (a checkpoint's directory) or process PID has ended, 60 s at most;
# returns 0 when PATH exists.
cluster_wait_for() {
  local _
  for _ in $(seq 1 6000); do
    [ -e "$1" ] && return 0
    kill -0 "$2" 2> /dev/null || break
    sleep 0.01
  done
  [ -e "$1" ]
}

cluster_kill_host() {
  local pids
  pids=$(ip netns pids "$(cluster_ns "$1")")
  [ -n "$pids" ] && kill -9 $pids 2> /dev/null
  echo "$pids" | wc -w
}

# cluster_kill_program I PROGRAM: kill -9 the processes of host I that run PROGRAM (by its
# executable's path) — the training ranks only; the host's Open MPI daemon lives on, as after a
# rank's crash or an OOM kill on a live host. Prints how many were killed.
cluster_kill_program() {
  local pid pids="" exe
  exe=$(readlink -f "$2")
  for pid in $(ip netns pids "$(cluster_ns "$1")"); do
    [ "$(readlink -f "/proc/$pid/exe" 2> /dev/null)" = "$exe" ] && pids+="$pid "
  done
  [ -n "$pids" ] && kill -9 $pids 2> /dev/null
  echo "$pids" | wc -w
}

cluster_link() {
  ip -n "${CLUSTER_PREFIX}-br" link set "v$1" "$2"
}

cluster_limit() {  # cluster_limit I RATE [BURST]: BURST default 64kbit (raise it for high rates)
  tc -n "${CLUSTER_PREFIX}-br" qdisc replace dev "v$1" root tbf rate "$2" burst "${3:-64kbit}" latency 50ms
}

# Every host's orted connects back: mpirun in host 0 runs `hostname -I` (the addresses of the
# namespace the process is in) once per host, and each host's address must be among the answers.
cluster_check_orted() {
  local hf=$CLUSTER_DIR/check.hosts out i
  cluster_hostfile "$hf" 1
  out=$(cluster_mpirun --hostfile "$hf" --map-by node -np "$CLUSTER_HOSTS" hostname -I 2>&1) ||
    { echo "$out"; echo "FAIL: mpirun across the hosts failed"; return 1; }
  for ((i = 0; i < CLUSTER_HOSTS; i++)); do
    grep -qw "$(cluster_addr $i)" <<< "$out" ||
      { echo "$out"; echo "FAIL: no process ran in host $i ($(cluster_addr $i)): its orted did not connect back"; return 1; }
  done
  echo "orted check: a process ran in each of the $CLUSTER_HOSTS hosts ($(tr '\n' ' ' <<< "$out"))"
}
