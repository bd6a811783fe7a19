#!/bin/bash
# AWS ParallelCluster custom bootstrap action (OnNodeConfigured) for stepscope.
#
#   install-stepscope.sh S3_PREFIX [PIP_SPEC] [--hpc-job]
#
# S3_PREFIX  where systemd/stepscope.service and deploy/parallelcluster/*.sh were uploaded
#            (aws s3 cp systemd/stepscope.service deploy/parallelcluster/*.sh s3://b/stepscope/)
# PIP_SPEC   what to pip install (default: stepscope; a wheel's s3:// path also works)
# --hpc-job  label GPU series with the Slurm job that owns the GPU (hpc_job; see
#            docs/deploy/parallelcluster.md for its cardinality cost)
#
# Compute nodes get the exporter as a hardened systemd unit; the head node gets the Slurm
# prolog/epilog (ParallelCluster >= 3.6 runs every script in prolog.d/ and epilog.d/).
set -euo pipefail

prefix="${1:?usage: install-stepscope.sh S3_PREFIX [PIP_SPEC] [--hpc-job]}"
spec="${2:-stepscope}"
hpc_job="${3:-}"
prefix="${prefix%/}"
jobs_dir=/run/stepscope-jobs

node_type=ComputeFleet
if [ -r /etc/parallelcluster/cfnconfig ]; then
    # shellcheck disable=SC1091
    . /etc/parallelcluster/cfnconfig
    node_type="${cfn_node_type:-ComputeFleet}"
fi

fetch() { # fetch SRC DEST: from S3 (aws CLI, on every ParallelCluster AMI) or a local path
    case "$1" in
        s3://*) aws s3 cp --only-show-errors "$1" "$2" ;;
        *) cp "$1" "$2" ;;
    esac
}

install_slurm_scripts() {
    local scripts=/opt/slurm/etc/scripts
    install -d -m 0755 "$scripts/prolog.d" "$scripts/epilog.d"
    fetch "$prefix/slurm-prolog.sh" "$scripts/prolog.d/90_stepscope.sh"
    fetch "$prefix/slurm-epilog.sh" "$scripts/epilog.d/90_stepscope.sh"
    chmod 0755 "$scripts/prolog.d/90_stepscope.sh" "$scripts/epilog.d/90_stepscope.sh"
}

pick_python() { # the first Python >= 3.10 here; on Amazon Linux 2023 install 3.11
    local py
    for py in python3.12 python3.11 python3.10 python3; do
        if command -v "$py" >/dev/null &&
            "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
            echo "$py"
            return
        fi
    done
    if command -v dnf >/dev/null; then
        dnf install -q -y python3.11 >&2 && echo python3.11 && return
    fi
    echo "stepscope: no Python >= 3.10 on this node" >&2
    return 1
}

install_exporter() {
    local py
    py="$(pick_python)"
    id stepscope >/dev/null 2>&1 ||
        useradd --system --no-create-home --home-dir /nonexistent \
            --shell /sbin/nologin stepscope
    "$py" -m venv /opt/stepscope
    case "$spec" in
        s3://*)
            fetch "$spec" "/tmp/$(basename "$spec")"
            spec="/tmp/$(basename "$spec")"
            ;;
    esac
    /opt/stepscope/bin/pip install -q --disable-pip-version-check "$spec"
    fetch "$prefix/stepscope.service" /etc/systemd/system/stepscope.service
    chmod 0644 /etc/systemd/system/stepscope.service
    if [ ! -e /etc/default/stepscope ]; then
        {
            echo "# stepscope settings: STEPSCOPE_<NAME>=value (see the README)"
            echo "STEPSCOPE_INTERVAL=1"
            if [ "$hpc_job" = "--hpc-job" ]; then
                echo "STEPSCOPE_HPC_JOB_DIR=$jobs_dir"
            fi
        } >/etc/default/stepscope
    fi
    systemctl daemon-reload
    systemctl enable --now stepscope.service
}

case "$node_type" in
    HeadNode)
        if [ "$hpc_job" = "--hpc-job" ]; then install_slurm_scripts; fi
        ;;
    ComputeFleet)
        install_exporter
        ;;
    *)
        echo "stepscope: nothing to do on a $node_type node"
        ;;
esac
