#!/bin/sh
# slurm-gpushare TaskProlog: for a gres/mps share, limit the task's GPU memory with CUDA MPS.
# slurm.conf: TaskProlog=/path/to/taskprolog.sh. Runs as the job's user before each task;
# each "export NAME=value" line it prints is set in the task's environment.
# The limit comes from the decision's AdminComment tag (...:mps=<pct>:...:mem=<MiB>:...).
# Slurm itself sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for gres/mps jobs; it is set here only if
# missing. gres/shard jobs get nothing: shards have no hardware limit (the telemetry agent
# reports a job that outgrows its share instead).
# Every share: sbatch put the GPU options the job was submitted with (--gpus/-G,
# --gpus-per-node) into SLURM_GPUS/SLURM_GPUS_PER_NODE; srun reads them back and would ask the
# job for a whole GPU it no longer holds ("Invalid generic resource"), so they are unset and
# steps inherit the share instead. Always exits 0.
tag=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null |
      sed -n 's/.*AdminComment=\(gpushare:v[0-9]*:share:[^ ]*\).*/\1/p')
case "$tag" in
  gpushare:*:share:*)
    echo "unset SLURM_GPUS"
    echo "unset SLURM_GPUS_PER_NODE"
    ;;
esac
case "$tag" in
  *:mps=*:mem=*)
    mem=$(printf '%s\n' "$tag" | sed -n 's/.*:mem=\([0-9][0-9]*\).*/\1/p')
    pct=$(printf '%s\n' "$tag" | sed -n 's/.*:mps=\([0-9][0-9]*\).*/\1/p')
    # Device 0: inside the job, its one visible GPU.
    [ -n "$mem" ] && echo "export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=${mem}M"
    [ -n "$pct" ] && [ -z "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" ] &&
      echo "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${pct}"
    ;;
esac
exit 0
