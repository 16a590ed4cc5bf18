#!/usr/bin/env bash
# Issue 24 item 5: static 8, CPT 3-8/8 n8 and the planner's pick at CPT's cost (BitOPs), 3 seeds each, with
# `cptsim sweep`, on three graphs: karate (embedded), a synthetic stochastic-block-model graph, and a Planetoid-format
# directory generated here (PyG's raw ind.<name>.* files, read back through cptsim's restricted unpickler).
# The --budget of each is CPT's own cost relative to static 8 on that workload (`cptsim cost ... --json`,
# relative_to_static), so the planner's pick competes with CPT at CPT's price. The model is the default gcn (cpt_gnn's
# arxiv QGCN) with the graph recipe (Adam 1e-3 annealed to 1e-4, 200 full-batch epochs).
#
#   benchmarks/gnn_evidence.sh [OUT [NAME...]]   (default runs/ev24, all of karate synthetic planetoid; ~1 h on 2
#                                                 busy cores)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/ev24}
shift || true
WANT=${*:-karate synthetic planetoid}
mkdir -p "$OUT"
CPT=cpt:3-8:g8:n8

"$PY" - "$OUT/planetoid-data" <<'EOF'
import sys, torch
from cptsim.data.graph import synthetic_graph, write_planetoid
# a Cora-sized graph written as Planetoid files: 20 labelled nodes per class first, the last 1000 nodes the test set
g = synthetic_graph(2708, 32, 7, 4, seed=11)
order = torch.cat([torch.nonzero(g.y == c).flatten()[:20] for c in range(7)])
rest = torch.tensor([i for i in range(2708) if i not in set(order.tolist())])
perm = torch.cat([order, rest])
inv = torch.empty_like(perm); inv[perm] = torch.arange(2708)
write_planetoid(sys.argv[1], "synth", g.x[perm], g.y[perm], inv[g.edge_index], num_train=140,
                test_index=torch.arange(1708, 2708))
print("wrote", sys.argv[1])
EOF

sweep() {  # NAME DATASET VAL_SPLIT [data flags...]
  local name=$1 dataset=$2 val=$3; shift 3
  case " $WANT " in *" $name "*) ;; *) return 0 ;; esac
  local budget
  budget=$("$PY" -m cptsim.cli.main cost --model gcn --dataset "$dataset" "$@" --schedule "$CPT" --hw bitfusion --json \
           | "$PY" -c "import json,sys; print(f\"{100 * json.load(sys.stdin)['profiles'][0]['relative_to_static']:.2f}%\")")
  echo "== $name: CPT's cost is $budget of static 8's BitOPs"
  "$PY" -m cptsim.cli.main sweep --model gcn --dataset "$dataset" "$@" --schedules static:8:g8,$CPT --top 1 \
      --budget "$budget" --hw bitfusion --seeds 0-2 --val-split "$val" --jobs 2 --no-db --out "$OUT/$name" --quiet
}

# karate has no validation nodes to spare (4 labelled, 30 tested): --val-split 0; the others validate on their own
# validation mask (a graph's --val-split > 0 means "its mask", not a fraction)
sweep karate karate 0
sweep synthetic synthetic-graph:2000,16,6:3 0.2
sweep planetoid planetoid 0.2 --data-dir "$OUT/planetoid-data"
