#!/bin/bash
# Slurm prolog: record which job owns which GPU on this node, for stepscope's `hpc_job`
# label (off unless the exporter's hpc_job_dir is set). Runs as root on every node of a
# job before it starts. The format is dcgm-exporter's HPC job mapping: one file per GPU
# index, named by the index, holding the job id.
# Slurm sets SLURM_JOB_ID and SLURM_JOB_GPUS (the job's GPU indices, "0,1") for prologs.
set -u
dir="${STEPSCOPE_HPC_JOB_DIR:-/run/stepscope-jobs}"
job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-}"
# Never fail a job because of monitoring: every error below exits 0.
[ -n "$job" ] && [ -n "$gpus" ] || exit 0
install -d -m 0755 "$dir" 2>/dev/null || exit 0
IFS=',' read -r -a indices <<<"$gpus"
for gpu in "${indices[@]}"; do
    [[ "$gpu" =~ ^[0-9]+$ ]] || continue
    tmp="$dir/.$gpu.$job"
    # write then rename: the exporter never reads a half-written file
    printf '%s\n' "$job" >"$tmp" 2>/dev/null && chmod 0644 "$tmp" && mv -f "$tmp" "$dir/$gpu"
done
exit 0
