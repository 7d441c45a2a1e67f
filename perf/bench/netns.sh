#!/bin/bash
# SPDX-License-Identifier: MIT
#
# netns.sh - a small emulated cluster made of network namespaces, for
# perf/bench/compare.sh (which sources it); it can also be run on its own.
#
#   ${BENCH_NS_PREFIX}hub        holds bridge br0, the "switch"
#   ${BENCH_NS_PREFIX}h0..h<N-1> one namespace per emulated host; its end of
#                                the veth pair is eth0, address
#                                ${BENCH_SUBNET}.<i+1>/24; the other end, p<i>,
#                                is a port of br0 in the hub namespace.
#
# Shaping: a tbf at RATE on each host's eth0 egress and (shape "both", the
# default) on its switch port p<i> too, i.e. a full-duplex link of RATE each
# way, so incast cannot exceed the line rate either.  Burst: 1 ms worth of
# bytes, at least 128 KiB (veth GSO packets are up to 64 KiB); queue: what
# the tbf holds, as its "latency", $NS_TBF_LATENCY (default 50ms).
#
# Racks (NS_RACKS=R, default 1): the hosts in R racks of consecutive ones,
# each rack a bridge rb<k> of its own, and the racks joined by a core bridge
# (br0) through one link each, shaped at NS_RACK_RATE (default 1gbit) both
# ways: a two-level network (setup's --racks R --rack-rate RATE).
#
# Delay: DELAY_US one-way between any two hosts.  With sch_netem in the kernel
# a netem qdisc (the tbf as its child) on each host's egress; without it (as
# on the development VM) the user-space delay line nfq_delay.c, built into
# the work directory, one per host, behind an iptables-legacy NFQUEUE rule on
# the host's eth0 ingress.
#
# Nothing is created in, or routed to, the caller's namespace: all traffic
# stays in the namespaces made here.  Default addresses are in 198.18.0.0/15,
# the RFC 2544 benchmarking range.  Root needed (ip, tc; iptables-legacy and
# libnetfilter-queue-dev only for a delay without netem).
#
# Standalone:
#   netns.sh setup N [--rate R|unshaped] [--delay-ms D] [--shape egress|both]
#                    [--queue-ms Q] [--racks R --rack-rate RATE] [--workdir DIR]
#   netns.sh teardown [--workdir DIR]
#   netns.sh status
#   netns.sh exec I CMD...
# (setup leaves the namespaces, and the delay lines, running; teardown ends
# them.  compare.sh does both itself, with a trap.)

BENCH_NS_PREFIX=${BENCH_NS_PREFIX:-frbench_}
BENCH_SUBNET=${BENCH_SUBNET:-198.18.0}
BENCH_HERE=${BENCH_HERE:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}

ns_log() { echo "netns: $*" >&2; }

ns_host() { echo "${BENCH_NS_PREFIX}h$1"; }
ns_addr() { echo "${BENCH_SUBNET}.$(($1 + 1))"; }

# "1gbit" -> bytes per second (tc's units)
ns_rate_bytes() {
	local r=${1,,} num unit
	num=${r%%[a-z]*}
	unit=${r#"$num"}
	[[ "$num" =~ ^[0-9]+$ ]] || return 1
	case "$unit" in
	bit | "") echo $((num / 8)) ;;
	kbit) echo $((num * 1000 / 8)) ;;
	mbit) echo $((num * 1000000 / 8)) ;;
	gbit) echo $((num * 1000000000 / 8)) ;;
	bps) echo "$num" ;;
	kbps) echo $((num * 1000)) ;;
	mbps) echo $((num * 1000000)) ;;
	gbps) echo $((num * 1000000000)) ;;
	*) return 1 ;;
	esac
}

ns_netem_available() {
	local ns="${BENCH_NS_PREFIX}probe$$" ok=0
	ip netns add "$ns" 2>/dev/null || return 1
	ip -n "$ns" link add pr0 type veth peer name pr1 2>/dev/null &&
		tc -n "$ns" qdisc add dev pr0 root netem delay 1ms 2>/dev/null && ok=1
	ip netns del "$ns"
	((ok))
}

# ns_build_nfq_delay WORKDIR -> path of the built binary on stdout
ns_build_nfq_delay() {
	local out=$1/nfq_delay
	[[ -x "$out" && "$out" -nt "$BENCH_HERE/nfq_delay.c" ]] && { echo "$out"; return 0; }
	if ! ${CC:-cc} -O2 -Wall -Wextra -o "$out" "$BENCH_HERE/nfq_delay.c" \
		-lnetfilter_queue -lnfnetlink >"$1/nfq_delay.build.log" 2>&1; then
		ns_log "cannot build nfq_delay (apt-get install libnetfilter-queue-dev?):"
		cat "$1/nfq_delay.build.log" >&2
		return 1
	fi
	echo "$out"
}

# The delay-line daemons we started, by PID, in $NS_WORKDIR/nfq.pids.
ns_stop_delay_lines() {
	local pf=${NS_WORKDIR:-/nonexistent}/nfq.pids pid
	[[ -f "$pf" ]] || return 0
	while read -r pid; do
		[[ -n "$pid" ]] || continue
		if kill -0 "$pid" 2>/dev/null && grep -q nfq_delay "/proc/$pid/cmdline" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null
			for _ in 1 2 3 4 5 6 7 8 9 10; do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
		fi
	done <"$pf"
	rm -f "$pf"
}

ns_list() {
	ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${BENCH_NS_PREFIX}(h[0-9]+|hub)$" || true
}

ns_teardown() {
	local ns pids
	ns_stop_delay_lines
	# Whatever still runs inside our namespaces was started there by us
	# (ranks, orteds after a timeout): end it, by PID, before deleting.
	pids=$(for ns in $(ns_list); do ip netns pids "$ns" 2>/dev/null; done)
	if [[ -n "$pids" ]]; then
		# shellcheck disable=SC2086
		kill -TERM $pids 2>/dev/null
		sleep 1
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null
	fi
	for ns in $(ns_list); do ip netns del "$ns" 2>/dev/null || true; done
}

# shape one device: ns_shape NS DEV RATE [NETEM_DELAY_US]
ns_shape() {
	local ns=$1 dev=$2 rate=$3 dus=${4:-0} bps burst parent="root handle 1:"
	if ((dus > 0)); then
		tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "${dus}us" limit 100000 || return 1
		parent="parent 1:1 handle 10:"
	fi
	[[ "$rate" == unshaped ]] && return 0
	bps=$(ns_rate_bytes "$rate") || { ns_log "cannot parse rate '$rate' (e.g. 1gbit, 100mbit)"; return 1; }
	burst=$((bps / 1000))
	((burst < 131072)) && burst=131072
	# shellcheck disable=SC2086
	tc -n "$ns" qdisc add dev "$dev" $parent tbf rate "$rate" burst "$burst" latency "${NS_TBF_LATENCY:-50ms}"
}

# ns_setup N RATE DELAY_US SHAPE WORKDIR
# RATE: a tc rate, or "unshaped".  Returns non-zero (after cleaning up) on
# failure.  Sets NS_DELAY_METHOD (none|netem|nfqueue).
ns_setup() {
	local n=$1 rate=$2 dus=$3 shape=$4 hub="${BENCH_NS_PREFIX}hub" i ns nfq="" pid
	NS_WORKDIR=$5
	NS_DELAY_METHOD=none
	# shellcheck disable=SC2015
	[[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || { ns_log "bad host count '$n'"; return 1; }
	# ping checks that every host is reachable; a fresh Debian has none
	command -v ping >/dev/null || { ns_log "ping not found (apt-get install iputils-ping)"; return 1; }
	if [[ -n "$(ns_list)" ]]; then
		ns_log "namespaces ${BENCH_NS_PREFIX}* exist already (another run, or a crashed one: '$BENCH_HERE/netns.sh teardown')"
		return 1
	fi
	if ((dus > 0)); then
		if ns_netem_available; then
			NS_DELAY_METHOD=netem
		else
			NS_DELAY_METHOD=nfqueue
			command -v iptables-legacy >/dev/null || { ns_log "iptables-legacy missing (apt-get install iptables)"; return 1; }
			nfq=$(ns_build_nfq_delay "$NS_WORKDIR") || return 1
		fi
	fi
	{
		ip netns add "$hub" &&
			ip -n "$hub" link set lo up &&
			ip -n "$hub" link add br0 type bridge &&
			ip -n "$hub" link set br0 up
	} || { ns_teardown; return 1; }
	# racks (NS_RACKS=R > 1): the hosts in R groups of consecutive ones,
	# each on its own bridge rb<k>, and the racks joined by a core
	# bridge (br0) through one link each, shaped at NS_RACK_RATE both ways
	local racks=${NS_RACKS:-1} k
	if ((racks > 1)); then
		((n % racks == 0)) || { ns_log "$n hosts do not make $racks racks"; ns_teardown; return 1; }
		for ((k = 0; k < racks; k++)); do
			{
				ip -n "$hub" link add "rb$k" type bridge &&
					ip -n "$hub" link set "rb$k" up &&
					ip -n "$hub" link add "ru$k" type veth peer name "rc$k" &&
					ip -n "$hub" link set "ru$k" master "rb$k" up &&
					ip -n "$hub" link set "rc$k" master br0 up &&
					ns_shape "$hub" "ru$k" "${NS_RACK_RATE:-1gbit}" 0 &&
					ns_shape "$hub" "rc$k" "${NS_RACK_RATE:-1gbit}" 0
			} || { ns_log "setting up rack $k failed"; ns_teardown; return 1; }
		done
	fi
	for ((i = 0; i < n; i++)); do
		ns=$(ns_host "$i")
		{
			ip netns add "$ns" &&
				ip -n "$ns" link set lo up &&
				ip -n "$hub" link add "p$i" type veth peer name eth0 netns "$ns" &&
				ip -n "$hub" link set "p$i" master "$( ((racks > 1)) && echo "rb$((i / (n / racks)))" || echo br0)" up &&
				ip -n "$ns" link set eth0 up &&
				ip -n "$ns" addr add "$(ns_addr "$i")/24" dev eth0 &&
				ns_shape "$ns" eth0 "$rate" "$([[ $NS_DELAY_METHOD == netem ]] && echo "$dus" || echo 0)" &&
				if [[ "$shape" == both ]]; then ns_shape "$hub" "p$i" "$rate" 0; fi
		} || { ns_log "setting up $ns failed"; ns_teardown; return 1; }
		if [[ "$NS_DELAY_METHOD" == nfqueue ]]; then
			ip netns exec "$ns" "$nfq" --delay-us "$dus" --queue 0 </dev/null \
				>"$NS_WORKDIR/nfq_delay.h$i.log" 2>&1 &
			pid=$!
			echo "$pid" >>"$NS_WORKDIR/nfq.pids"
			for _ in $(seq 50); do grep -q ready "$NS_WORKDIR/nfq_delay.h$i.log" 2>/dev/null && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
			if ! kill -0 "$pid" 2>/dev/null || ! ip netns exec "$ns" iptables-legacy -t raw -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0; then
				ns_log "delay line in $ns failed: $(cat "$NS_WORKDIR/nfq_delay.h$i.log")"
				ns_teardown
				return 1
			fi
		fi
	done
	# bridge ports forward after a moment: wait until h0 reaches everyone
	for ((i = 1; i < n; i++)); do
		local ok=0
		for _ in $(seq 20); do
			if ip netns exec "$(ns_host 0)" ping -c1 -W1 -q "$(ns_addr "$i")" >/dev/null 2>&1; then ok=1; break; fi
			sleep 0.2
		done
		((ok)) || { ns_log "h0 cannot reach $(ns_addr "$i")"; ns_teardown; return 1; }
	done
	ns_log "$n hosts $(ns_host 0)..$(ns_host $((n - 1))) on ${BENCH_SUBNET}.0/24, rate $rate (shape $shape), one-way delay ${dus} us ($NS_DELAY_METHOD)$( ((racks > 1)) && echo ", $racks racks joined at ${NS_RACK_RATE:-1gbit}")"
}

# ns_rtt_ms: median ping RTT h0 -> h1 in ms (for the record)
ns_rtt_ms() {
	ip netns exec "$(ns_host 0)" ping -c 5 -i 0.2 -q "$(ns_addr 1)" 2>/dev/null |
		awk -F'[/ ]+' '/^rtt/ {print $7}'
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	set -uo pipefail
	cmd=${1:-}
	shift || true
	NS_WORKDIR=/run/frbench
	case "$cmd" in
	setup)
		n=${1:-}
		shift || true
		rate=1gbit dms=0 shape=both
		while (($#)); do
			case "$1" in
			--rate) rate=$2; shift 2 ;;
			--delay-ms) dms=$2; shift 2 ;;
			--shape) shape=$2; shift 2 ;;
			--queue-ms) NS_TBF_LATENCY=${2}ms; shift 2 ;;
			--racks) NS_RACKS=$2; shift 2 ;;
			--rack-rate) NS_RACK_RATE=$2; shift 2 ;;
			--workdir) NS_WORKDIR=$2; shift 2 ;;
			*) echo "netns.sh: unknown option $1" >&2; exit 2 ;;
			esac
		done
		mkdir -p "$NS_WORKDIR"
		ns_setup "$n" "$rate" "$(awk -v d="$dms" 'BEGIN{printf "%d", d*1000+0.5}')" "$shape" "$NS_WORKDIR"
		;;
	teardown)
		[[ "${1:-}" == --workdir ]] && NS_WORKDIR=$2
		ns_teardown
		;;
	status)
		for ns in $(ns_list); do
			echo "== $ns"
			ip -n "$ns" -br addr
			tc -n "$ns" qdisc show | grep -v noqueue
		done
		;;
	exec)
		i=$1
		shift
		exec ip netns exec "$(ns_host "$i")" "$@"
		;;
	*)
		awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"
		exit 2
		;;
	esac
fi
