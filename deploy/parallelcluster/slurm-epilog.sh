#!/bin/bash
# Slurm epilog: forget this job's GPUs in stepscope's HPC job mapping (see slurm-prolog.sh).
# Removes only files that still name this job, so a late epilog never erases the mapping
# of the next job on the same GPU.
set -u
dir="${STEPSCOPE_HPC_JOB_DIR:-/run/stepscope-jobs}"
job="${SLURM_JOB_ID:-}"
[ -n "$job" ] && [ -d "$dir" ] || exit 0
for file in "$dir"/*; do
    [ -f "$file" ] || continue
    [[ "$(basename "$file")" =~ ^[0-9]+$ ]] || continue
    if [ "$(head -n 1 "$file" 2>/dev/null)" = "$job" ]; then
        rm -f "$file"
    fi
done
exit 0
