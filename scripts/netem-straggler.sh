#!/usr/bin/env bash
# netem-straggler.sh: a real network straggler for a ParM replica pool.
#
# The seeded --straggle schedule of `hams modelserver` delays calls inside
# the server; this script instead puts one replica behind a slow link:
# tc netem on a veth pair between two network namespaces it creates.
#
#   hams-cli-<id>   loopback: the deployment (hams up), the fast replicas
#                   (127.0.0.1:7001-7003), the parity instances
#                   (127.0.0.1:7101-7102); veth end 192.168.213.1/30
#   hams-srv-<id>   one replica, `hams modelserver --listen
#                   192.168.213.2:7000`; veth end 192.168.213.2/30 with
#                   `tc qdisc add ... root netem delay 30ms 10ms`
#
# Every address is inside these two namespaces (the /30 lives on the veth
# pair the script creates): no traffic leaves them. Everything is removed
# on exit (trap): the processes the script started, then both namespaces
# (deleting a namespace deletes its veth end, and with it the pair).
#
# Modes:
#   run (default)  start the replicas, the parity instances and `hams up`
#                  with two services over the same replicas, lin-none
#                  (redundancy none) and lin-parm (redundancy parm, k = 2),
#                  drive a short closed-loop load at each through the
#                  frontend's HTTP/JSON API, and print p50 / p99 / max and
#                  the approximate fraction of both, then clean up.
#   serve          set up the namespaces and the delayed replica only,
#                  print how to run a deployment against it, and wait
#                  until interrupted (Ctrl-C cleans up).
#
# Pointing a pool at the delayed replica (serve mode): list it in the
# model's replicas, with the other instances as addresses too (a replicas
# list is all addresses or a count, never both), and run the deployment
# inside the client namespace so it can reach 192.168.213.2:
#
#   models:
#     - name: lin
#       kind: linear
#       params: {in: 64, out: 16, seed: 1}
#       batch: {size: 1}
#       replicas: [192.168.213.2:7000, 127.0.0.1:7001, 127.0.0.1:7002, 127.0.0.1:7003]
#       redundancy: parm
#       parity: {k: 2, backends: [127.0.0.1:7101, 127.0.0.1:7102]}
#
#   ip netns exec hams-cli-<id> hams modelserver --config F --models lin --listen 127.0.0.1:7001   # and 7002, 7003
#   ip netns exec hams-cli-<id> hams modelserver --config F --parity-of lin --listen 127.0.0.1:7101 # and 7102
#   ip netns exec hams-cli-<id> hams up --config F --mode bare
#
# (the delayed replica must host the same model: serve mode starts it with
# --models lin from the file given by --config, default: the run mode's).
#
# Usage: scripts/netem-straggler.sh [run|serve] [--hams BIN] [--delay 30ms]
#          [--jitter 10ms] [--requests 400] [--clients 4] [--config FILE]
#          [--no-netem]
#   --no-netem   skip the qdisc (a plumbing check on kernels without
#                sch_netem: then both arms see the same fast replicas)
# Needs: root, ip and tc (Debian: apt-get install -y iproute2), a kernel
# with the netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem), curl.
set -euo pipefail

mode=run
hams=${HAMS_BIN:-bin/hams}
delay=30ms
jitter=10ms
requests=400
clients=4
config=
netem=1
while [ $# -gt 0 ]; do
	case "$1" in
	run | serve) mode=$1 ;;
	--hams) hams=$2; shift ;;
	--delay) delay=$2; shift ;;
	--jitter) jitter=$2; shift ;;
	--requests) requests=$2; shift ;;
	--clients) clients=$2; shift ;;
	--config) config=$2; shift ;;
	--no-netem) netem=0 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "netem-straggler: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done

die() { echo "netem-straggler: $*" >&2; exit "${code:-1}"; }

# Refuse clearly before touching anything.
[ "$(id -u)" = 0 ] || code=2 die "needs root (it creates network namespaces, a veth pair and a tc qdisc); run it with sudo"
for tool in ip tc curl; do
	command -v "$tool" >/dev/null 2>&1 || code=2 die "$tool is missing (Debian: apt-get install -y $([ "$tool" = curl ] && echo curl || echo iproute2))"
done
[ -x "$hams" ] || code=2 die "no hams binary at $hams (make build, or --hams BIN)"
hams=$(cd "$(dirname "$hams")" && pwd)/$(basename "$hams")
[[ $requests =~ ^[0-9]+$ && $clients =~ ^[0-9]+$ && $clients -ge 1 && $requests -ge $clients ]] ||
	code=2 die "--requests ($requests) and --clients ($clients): integers, requests >= clients >= 1"

if [ -n "$config" ]; then
	[ "$mode" = serve ] || code=2 die "--config is for serve mode (run mode writes its own two-service file)"
	[ -r "$config" ] || code=2 die "--config $config: not a readable file"
fi

id=$$
cli=hams-cli-$id
srv=hams-srv-$id
vcli=hsc$id
vsrv=hss$id
work=$(mktemp -d /tmp/hams-netem-XXXXXX)
pids=()

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	for ns in "$cli" "$srv"; do
		if ip netns list | grep -qw "$ns"; then
			# Anything still running in a namespace this script made was
			# started by it (hams up's children).
			for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
			ip netns del "$ns" || echo "netem-straggler: could not delete namespace $ns" >&2
		fi
	done
	ip link del "$vcli" 2>/dev/null || true
	if [ "$rc" = 0 ]; then rm -rf "$work"; else echo "netem-straggler: logs kept in $work" >&2; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "netem-straggler: namespaces $cli and $srv, veth $vcli <-> $vsrv (192.168.213.1/30 <-> 192.168.213.2/30), work dir $work"
ip netns add "$cli" || die "ip netns add $cli failed"
ip netns add "$srv" || die "ip netns add $srv failed"
ip link add "$vcli" type veth peer name "$vsrv" || die "ip link add $vcli type veth peer name $vsrv failed"
ip link set "$vcli" netns "$cli"
ip link set "$vsrv" netns "$srv"
ip -n "$cli" addr add 192.168.213.1/30 dev "$vcli"
ip -n "$srv" addr add 192.168.213.2/30 dev "$vsrv"
for ns in "$cli" "$srv"; do ip -n "$ns" link set lo up; done
ip -n "$cli" link set "$vcli" up
ip -n "$srv" link set "$vsrv" up

if [ "$netem" = 1 ]; then
	# Delays the replica's answers (egress of its veth end): each call
	# pays delay±jitter once.
	if ! ip netns exec "$srv" tc qdisc add dev "$vsrv" root netem delay "$delay" "$jitter" 2>"$work/tc.err"; then
		cat "$work/tc.err" >&2
		code=3 die "tc netem failed: the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM; try modprobe sch_netem), or --delay/--jitter are not tc durations; --no-netem runs the plumbing without it"
	fi
	echo "netem-straggler: $(ip netns exec "$srv" tc qdisc show dev "$vsrv")"
else
	echo "netem-straggler: --no-netem: no delay on the link (plumbing check only)"
fi

if [ -z "$config" ]; then
	config=$work/netem.yaml
	cat >"$config" <<'EOF'
# Two pools over the same four replicas (replica 0 behind the netem link)
# and two parity instances: lin-none (no redundancy) and lin-parm (ParM,
# k = 2, the linear model is its own exact parity model). Each replica
# server hosts both models (the same weights).
name: netem-straggler
hosts: [h1, h2]
models:
  - name: lin-none
    kind: linear
    batch: {size: 1}
    params: {in: 64, out: 16, seed: 1}
    placement: {primary: h1, standby: h2}
    replicas: [192.168.213.2:7000, 127.0.0.1:7001, 127.0.0.1:7002, 127.0.0.1:7003]
    redundancy: none
  - name: lin-parm
    kind: linear
    batch: {size: 1}
    params: {in: 64, out: 16, seed: 1}
    placement: {primary: h1, standby: h2}
    replicas: [192.168.213.2:7000, 127.0.0.1:7001, 127.0.0.1:7002, 127.0.0.1:7003]
    redundancy: parm
    parity: {k: 2, backends: [127.0.0.1:7101, 127.0.0.1:7102], decode_after: 0ms}
services:
  - name: lin-none
    inputs: [{name: images, datatype: FP32, shape: [-1, 64]}]
    edges: [[frontend, lin-none], [lin-none, frontend]]
  - name: lin-parm
    inputs: [{name: images, datatype: FP32, shape: [-1, 64]}]
    edges: [[frontend, lin-parm], [lin-parm, frontend]]
EOF
fi
if [ "$config" = "$work/netem.yaml" ]; then
	models=lin-none,lin-parm
else
	models=$(awk '$1 == "-" && $2 == "name:" {print $3; exit}' "$config")
	[ -n "$models" ] || code=2 die "--config $config: no model found"
fi

# start NAME NS ARGS...: a hams process in namespace NS, stdout (its JSON
# ready line) and stderr in $work/NAME.*; waits up to 30 s for the ready
# line.
start() {
	local name=$1 ns=$2
	shift 2
	ip netns exec "$ns" "$hams" "$@" >"$work/$name.out" 2>"$work/$name.log" &
	pids+=($!)
	local pid=$! deadline=$((SECONDS + 30))
	until [ -s "$work/$name.out" ]; do
		kill -0 "$pid" 2>/dev/null || die "$name exited before it was ready: $(tail -3 "$work/$name.log")"
		[ $SECONDS -lt $deadline ] || die "$name: no ready line within 30 s: $(tail -3 "$work/$name.log")"
		sleep 0.1
	done
}

start replica-0 "$srv" modelserver --config "$config" --models "$models" --listen 192.168.213.2:7000 --metrics ""
echo "netem-straggler: delayed replica serving $models at 192.168.213.2:7000 (namespace $srv)"

if [ "$mode" = serve ]; then
	cat <<EOF
netem-straggler: serving until interrupted (Ctrl-C removes everything). Run the other instances and the
deployment inside $cli (the header of $0 shows a pool's replicas list), e.g.:
  ip netns exec $cli $hams modelserver --config $config --models $models --listen 127.0.0.1:7001   # 7002, 7003
  ip netns exec $cli $hams modelserver --config $config --models ${models##*,} --parity-of ${models##*,} --listen 127.0.0.1:7101   # 7102
  ip netns exec $cli $hams up --config $config --mode bare
EOF
	trap 'exit 0' INT TERM
	wait "${pids[0]}" || die "the delayed replica exited: $(tail -3 "$work/replica-0.log")"
	exit 0
fi

for i in 1 2 3; do
	start "replica-$i" "$cli" modelserver --config "$config" --models "$models" --listen "127.0.0.1:700$i" --metrics ""
done
for j in 1 2; do
	start "parity-$j" "$cli" modelserver --config "$config" --models lin-parm --parity-of lin-parm --listen "127.0.0.1:710$j" --metrics ""
done
start up "$cli" up --config "$config" --mode bare --run-dir "$work/run"
http=$(sed -n 's/.*"frontend_http":"\([^"]*\)".*/\1/p' "$work/up.out")
[ -n "$http" ] || die "hams up's ready line has no frontend_http: $(cat "$work/up.out")"
echo "netem-straggler: hams up serving lin-none and lin-parm, HTTP/JSON at $http (namespace $cli)"

body='{"inputs":[{"name":"images","datatype":"FP32","shape":[1,64],"data":['$(seq -s, 0.01 0.01 0.64)']}]}'
# arm SERVICE: $requests requests from $clients closed-loop clients; one
# line per request: seconds, approximate (0/1), ok (0/1).
arm() {
	local svc=$1 per=$((requests / clients))
	local w workers=()
	for w in $(seq "$clients"); do
		(
			for _ in $(seq "$per"); do
				out=$(ip netns exec "$cli" curl -s -m 10 -w '\n%{time_total}' -X POST -H 'content-type: application/json' \
					-d "$body" "http://$http/v1/services/$svc:predict" || true)
				t=${out##*$'\n'}
				b=${out%$'\n'*}
				a=0 ok=0
				[[ $b == *'"approximate":true'* ]] && a=1
				[[ $b == *'"outputs"'* ]] && ok=1
				echo "$t $a $ok"
			done >"$work/$svc.lat.$w"
		) &
		workers+=($!)
	done
	wait "${workers[@]}"
	cat "$work/$svc.lat".* >"$work/$svc.lat"
	sort -n "$work/$svc.lat" | awk -v svc="$svc" '
		{ t[NR] = $1 * 1000; ap += $2; ok += $3 }
		END {
			p50 = t[int((NR - 1) * 0.50) + 1]; p99 = t[int((NR - 1) * 0.99) + 1]
			printf "  %-9s requests %4d  errors %3d  p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  approximate %5.1f%%\n", svc, NR, NR - ok, p50, p99, t[NR], 100 * ap / NR
		}'
}

echo "netem-straggler: $requests requests per arm, $clients clients, replica 0 behind netem delay $delay $jitter ($([ $netem = 1 ] && echo on || echo off))"
arm lin-none
arm lin-parm
errs=$(cat "$work"/lin-*.lat | awk '$3 == 0' | wc -l)
[ "$errs" = 0 ] || die "$errs requests failed (see $work)"
