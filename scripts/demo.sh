#!/usr/bin/env bash
# The main job until `mcm up` exists: build mcm, start the embedded API server and the machine controller (with the
# sim provider, whose simulated kubelets register the nodes), apply the example manifests with kubectl, wait for the
# single Machine to run, and show everything with its printer columns. The MachineSet and the MachineDeployment
# get their machines from their controllers.
# Usage: scripts/demo.sh [DATA_DIR]   (default: a fresh temporary directory; the server is stopped at the end)
set -euo pipefail
cd "$(dirname "$0")/.."

examples="${MCM_EXAMPLES:-../shared/examples/local}"
[ -d "$examples" ] || { echo "examples not found at $examples (set MCM_EXAMPLES)" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "kubectl is needed" >&2; exit 1; }

cargo build -q -p mcm
data_dir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/mcm-demo.XXXXXX")}"
target/debug/mcm apiserver --data-dir "$data_dir" >"$data_dir.log" 2>&1 &
server=$!
controller=""
trap 'kill $controller "$server" 2>/dev/null; wait $controller "$server" 2>/dev/null || true' EXIT

export KUBECONFIG="$data_dir/kubeconfig"
for _ in $(seq 100); do
    [ -f "$KUBECONFIG" ] && kubectl get --raw /readyz >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || { cat "$data_dir.log" >&2; exit 1; }
    sleep 0.1
done
kubectl get --raw /readyz >/dev/null

target/debug/mcm run --control-kubeconfig "$KUBECONFIG" --provider sim --sim-heartbeat-interval 2s --port 0 \
    >"$data_dir.controller.log" 2>&1 &
controller=$!

kubectl apply -f "$examples"
kubectl wait --for=jsonpath='{.status.currentStatus.phase}'=Running machine/single-machine --timeout=60s
kubectl get mcd,mcs,mc,mcc,nodes
echo
echo "API server data in $data_dir (kubeconfig: $KUBECONFIG); logs in $data_dir.log and $data_dir.controller.log"
