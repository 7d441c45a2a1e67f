#!/bin/bash
# On each of 3 Soft-RoCE VMs (tests/verbs_vm.sh --nodes 3): one rank per
# "host", so every ring hop crosses the virtual wire as RoCE v2 packets.
set -u
B=${FR_BUILDDIR:?}
ulimit -l unlimited
export FR_RANK=${RDMAVM_NODE:?} FR_NRANKS=${RDMAVM_NODES:?}
export FR_RENDEZVOUS=10.99.0.1:29517 FR_JOB_TOKEN=verbs-nodes FR_TRANSPORT=verbs
# the nodes boot at different times: allow for it
export FR_TIMEOUT_MS=120000
rc=0
"$B/tests/mp_allreduce" matrix --counts 0,1,2,7919,65537 \
	--dtypes f32,f64,bf16,f16,i32,u8 --ops sum,max,avg || rc=1
"$B/tests/mp_allreduce" regonce --iters 200 --count 4099 || rc=1
# every All-Reduce algorithm across the wire, and the other collectives
port=29520
for algo in ring rd rabenseifner oneshot tree; do
	FR_ALGO=$algo FR_RENDEZVOUS=10.99.0.1:$port "$B/tests/mp_allreduce" matrix \
		--counts 0,1,7919 --dtypes f32,bf16,i32 --ops sum,max || rc=1
	port=$((port + 1))
done
FR_RENDEZVOUS=10.99.0.1:$port "$B/tests/mp_allreduce" colls --counts 0,1,7919 || rc=1
# two QPs per connection (FR_IB_QPS): striped writes cross the wire as
# separate flows
FR_IB_QPS=2 FR_IB_STRIPE_BYTES=4K FR_RENDEZVOUS=10.99.0.1:29530 \
	"$B/tests/mp_allreduce" matrix --counts 0,7919,65537 --dtypes f32,bf16 \
	--ops sum || rc=1
FR_RENDEZVOUS=10.99.0.1:29518 "$B/fr_allreduce_perf" -b 8 -e 1M -f 16 -n 3 -w 1 || rc=1
# last: loss and a link flap (it leaves the link freshly restarted)
bash "$(dirname "$0")/verbs_netem_guest.sh" || rc=1
exit $rc
