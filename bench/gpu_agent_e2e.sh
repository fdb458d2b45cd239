#!/bin/bash
# Run from the repository root on a GPU machine (PYTHONPATH=$PWD when not installed); OUT: a folder.
# Records bench/results/gpu_agent_e2e.json as $OUT/agent_e2e.json.
# Two real training jobs share GPU 0; the node agent's real collectors sample them.
# train JOB_ID CONFIG SECONDS: a training job in the background.
S=/tmp/agentstate; rm -rf $S; mkdir -p $S
train() { SLURM_JOB_ID=$1 timeout 40 python3 -c "import sys,time;sys.path.insert(0,'bench');import gpu_workloads as g;s=g.build('$2');t=time.time()
while time.time()-t<$3: s()" & }
train 777 resnet50-b64 16; train 778 mobilenetv3-b64 16
sleep 6
for j in 777 778; do python3 -m slurm_gpushare.node.agent start --job-id $j --gpus 0 --cluster c1 --state-dir $S --socket /tmp/absent.sock; done
sleep 10
for j in 777 778; do python3 -m slurm_gpushare.node.agent stop --job-id $j --gpus 0 --cluster c1 --state-dir $S --socket /tmp/absent.sock --wait 30; done
wait
python3 - <<'PY' > $OUT/agent_e2e.json
import json,glob
out={f.split('/')[-1]: json.load(open(f)) for f in sorted(glob.glob('/tmp/agentstate/**/*.json', recursive=True))}
out['agent.log']=open('/tmp/agentstate/agent.log').read()[-1500:]
print(json.dumps(out, indent=1))
PY
