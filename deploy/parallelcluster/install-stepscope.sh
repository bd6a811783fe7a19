#!/bin/bash
# AWS ParallelCluster custom bootstrap action (OnNodeConfigured) for stepscope.
#
#   install-stepscope.sh SOURCE [--role compute|head] [--python PATH] [--hpc-job]
#                        [--ingest-group GROUP]
#
# SOURCE     where a release was put (deploy/parallelcluster/build-wheelhouse.sh makes it):
#            s3://BUCKET/PREFIX, or a directory on a shared filesystem (/fsx/stepscope).
#            It holds stepscope.service, slurm-prolog.sh, slurm-epilog.sh and wheelhouse/
#            (the stepscope wheel, its dependencies' wheels for the nodes' Python
#            versions and CPU, and pip's wheel), and `extras` when it was built with
#            --extras (auth: bcrypt for basic auth): then stepscope[EXTRAS] is installed.
# --role     compute (default): the exporter as a hardened systemd unit.
#            head: the Slurm prolog/epilog when --hpc-job is given, nothing else.
#            (Given explicitly: ParallelCluster does not support reading the node type
#            from /etc/parallelcluster/cfnconfig.)
# --python   an interpreter >= 3.10 to build the venv with, where the image's is older.
# --hpc-job  label GPU series with the Slurm job that owns the GPU (hpc_job; see
#            docs/deploy/parallelcluster.md for its cardinality cost).
# --ingest-group  the group whose members may report training steps: the unit runs with
#            it (a drop-in Group=GROUP), so the ingest socket (mode 0660) is created with
#            that group. Default: the service's own group `stepscope`, which nobody
#            else is in: add users with `usermod -aG stepscope USER`, or name a group the
#            cluster's users share. The group must exist on the node.
#
# No package index is contacted: pip installs from the wheelhouse only (--no-index), so
# nodes in subnets without internet access install the same as others. The node's
# bootstrap never fails because of stepscope: every problem is logged loudly (stderr,
# which ParallelCluster keeps with the node's bootstrap output; /var/log/stepscope-install.log;
# syslog) and the script exits 0, leaving a node without the exporter, not no node.
#
# STEPSCOPE_ROOT (empty on a node) installs below another root; the tests use it.
set -uo pipefail

ROOT="${STEPSCOPE_ROOT:-}"
LOG="$ROOT/var/log/stepscope-install.log"
VENV=/opt/stepscope
JOBS_DIR=/run/stepscope-jobs

log() {
    local line
    line="$(date -u +%Y-%m-%dT%H:%M:%SZ) stepscope-install: $*"
    echo "$line" >&2
    echo "$line" >>"$LOG" 2>/dev/null
    if command -v logger >/dev/null 2>&1; then logger -t stepscope-install -- "$*" 2>/dev/null; fi
    return 0
}

# Every failure ends here: loud, and exit 0 so the node still joins the cluster.
give_up() {
    log "ERROR: $*"
    log "ERROR: stepscope is NOT installed on this node; the node's bootstrap continues"
    exit 0
}

usage() {
    give_up "usage: install-stepscope.sh SOURCE [--role compute|head] [--python PATH] [--hpc-job] [--ingest-group GROUP]"
}

mkdir -p "$ROOT/var/log" 2>/dev/null

source_dir="${1:-}"
case "$source_dir" in "" | -*) usage ;; esac
shift
source_dir="${source_dir%/}"
role=compute
python=""
hpc_job=no
ingest_group=""
while [ $# -gt 0 ]; do
    case "$1" in
        --role) role="${2:-}"; shift 2 || usage ;;
        --python) python="${2:-}"; shift 2 || usage ;;
        --hpc-job) hpc_job=yes; shift ;;
        --ingest-group) ingest_group="${2:-}"; shift 2 || usage ;;
        *) log "ERROR: unknown argument '$1'"; usage ;;
    esac
done
case "$role" in compute | head) ;; *) give_up "--role must be compute or head, got '$role'" ;; esac
# a POSIX group name (it is written into a unit file: nothing else may pass)
case "$ingest_group" in
    *[!A-Za-z0-9._-]* | -*) give_up "--ingest-group must be a group name, got '$ingest_group'" ;;
esac

staging="$(mktemp -d 2>/dev/null)" || give_up "cannot create a temporary directory"
trap 'rm -rf "$staging"' EXIT

# fetch NAME DEST: one file or directory (trailing /) of SOURCE into DEST
fetch() {
    case "$source_dir" in
        s3://*)
            command -v aws >/dev/null 2>&1 || { log "ERROR: no aws CLI to read $source_dir"; return 1; }
            case "$1" in
                */) aws s3 cp --only-show-errors --recursive "$source_dir/$1" "$2" >>"$LOG" 2>&1 ;;
                *) aws s3 cp --only-show-errors "$source_dir/$1" "$2" >>"$LOG" 2>&1 ;;
            esac
            ;;
        *)
            case "$1" in
                */) mkdir -p "$2" && cp -R "$source_dir/$1." "$2" ;;
                *) cp "$source_dir/$1" "$2" ;;
            esac
            ;;
    esac
}

python_ok() { # PATH: an interpreter this package supports
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1
}

pick_python() {
    local py path
    if [ -n "$python" ]; then
        if python_ok "$python"; then echo "$python"; return 0; fi
        log "ERROR: --python $python is not a Python >= 3.10"
        return 1
    fi
    # Ubuntu 22.04: python3 is 3.10; 24.04: 3.12. Amazon Linux 2023, RHEL and Rocky 8/9:
    # python3 is older, python3.11 is an OS package (below).
    for py in python3.13 python3.12 python3.11 python3.10 python3; do
        path="$(command -v "$py" 2>/dev/null)" || continue
        if python_ok "$path"; then echo "$path"; return 0; fi
    done
    if command -v dnf >/dev/null 2>&1; then
        log "no Python >= 3.10 here: installing python3.11 with dnf (needs the OS repositories)"
        if dnf install -y -q python3.11 >>"$LOG" 2>&1; then
            path="$(command -v python3.11 2>/dev/null)" && python_ok "$path" && { echo "$path"; return 0; }
        fi
        log "ERROR: dnf could not install python3.11"
    fi
    log "ERROR: no Python >= 3.10 on this node (Amazon Linux 2 and Ubuntu 20.04 have none):"
    log "ERROR: put one on the image or a shared filesystem and pass --python PATH"
    return 1
}

install_slurm_scripts() {
    local scripts="$ROOT/opt/slurm/etc/scripts"
    mkdir -p "$scripts/prolog.d" "$scripts/epilog.d" || return 1
    fetch slurm-prolog.sh "$scripts/prolog.d/90_stepscope.sh" || return 1
    fetch slurm-epilog.sh "$scripts/epilog.d/90_stepscope.sh" || return 1
    chmod 0755 "$scripts/prolog.d/90_stepscope.sh" "$scripts/epilog.d/90_stepscope.sh"
}

install_exporter() {
    local py wheelhouse pip_wheel nologin extras requirement
    py="$(pick_python)" || give_up "no suitable Python"
    log "using $py ($("$py" -c 'import platform; print(platform.python_version())' 2>&1))"

    case "$source_dir" in
        s3://*) wheelhouse="$staging/wheelhouse"; fetch wheelhouse/ "$wheelhouse" ;;
        *) wheelhouse="$source_dir/wheelhouse" ;;
    esac
    [ -d "$wheelhouse" ] || give_up "no wheelhouse/ in $source_dir"
    pip_wheel="$(find "$wheelhouse" -maxdepth 1 -name 'pip-*.whl' | sort -V | tail -n 1)"
    [ -n "$pip_wheel" ] || give_up "no pip wheel in $source_dir/wheelhouse (build-wheelhouse.sh adds one)"
    fetch stepscope.service "$staging/stepscope.service" ||
        give_up "cannot read $source_dir/stepscope.service"

    # No pip inside the venv and no ensurepip needed (Ubuntu's python3-venv package is
    # not installed on every image): pip runs from its wheel, installs only from the
    # wheelhouse, and leaves nothing of itself behind.
    rm -rf "$ROOT$VENV"
    mkdir -p "$(dirname "$ROOT$VENV")"
    "$py" -m venv --without-pip "$ROOT$VENV" >>"$LOG" 2>&1 ||
        give_up "$py -m venv failed (see $LOG)"
    # the optional features the release was built with (build-wheelhouse.sh --extras)
    extras=""
    if fetch extras "$staging/extras" 2>/dev/null; then
        read -r extras <"$staging/extras" || true
        extras="${extras//[[:space:]]/}"
        case "$extras" in
            *[!a-z0-9,_-]*) give_up "$source_dir/extras must name extras such as auth, got '$extras'" ;;
        esac
    fi
    requirement="stepscope${extras:+[$extras]}"
    PIP_CONFIG_FILE=/dev/null "$ROOT$VENV/bin/python" "$pip_wheel/pip" install \
        --no-index --find-links "$wheelhouse" --no-cache-dir --disable-pip-version-check \
        --quiet "$requirement" >>"$LOG" 2>&1 ||
        give_up "pip could not install $requirement from $source_dir/wheelhouse for Python $("$py" -V 2>&1) (see $LOG: a wheel for this Python or CPU is missing?)"
    "$ROOT$VENV/bin/stepscope" --version >>"$LOG" 2>&1 ||
        give_up "the installed stepscope does not run (see $LOG)"

    if ! id stepscope >/dev/null 2>&1; then
        nologin="$(command -v nologin 2>/dev/null || echo /sbin/nologin)"
        useradd --system --no-create-home --home-dir /nonexistent --shell "$nologin" stepscope ||
            give_up "cannot create the system user stepscope"
    fi
    mkdir -p "$ROOT/etc/systemd/system" "$ROOT/etc/default" || give_up "cannot write $ROOT/etc"
    install -m 0644 "$staging/stepscope.service" "$ROOT/etc/systemd/system/stepscope.service" ||
        give_up "cannot install the unit"
    if [ ! -e "$ROOT/etc/default/stepscope" ]; then
        {
            echo "# stepscope settings: STEPSCOPE_<NAME>=value (see the README). systemd reads"
            echo "# this file at start only: systemctl restart stepscope after a change."
            echo "# Settings here win over /etc/stepscope/config.yaml."
            echo "STEPSCOPE_INTERVAL=1"
            if [ "$hpc_job" = yes ]; then echo "STEPSCOPE_HPC_JOB_DIR=$JOBS_DIR"; fi
        } >"$ROOT/etc/default/stepscope" || give_up "cannot write /etc/default/stepscope"
    fi
    mkdir -p "$ROOT/etc/stepscope" || give_up "cannot create /etc/stepscope"
    if [ ! -e "$ROOT/etc/stepscope/config.yaml" ]; then
        {
            echo "# stepscope settings (YAML, keys of the README's table), e.g."
            echo "#   host_label: hostname"
            echo "# systemctl reload stepscope re-reads this file; a change to listen, ingest"
            echo "# or web_config needs systemctl restart stepscope (the reload says so)."
        } >"$ROOT/etc/stepscope/config.yaml" || give_up "cannot write /etc/stepscope/config.yaml"
    fi
    dropin="$ROOT/etc/systemd/system/stepscope.service.d"
    rm -f "$dropin/ingest-group.conf"
    if [ -n "$ingest_group" ]; then
        if getent group "$ingest_group" >/dev/null 2>&1; then
            mkdir -p "$dropin" || give_up "cannot create $dropin"
            printf '%s\n' \
                "# install-stepscope.sh --ingest-group: members of $ingest_group may report steps" \
                "[Service]" "Group=$ingest_group" >"$dropin/ingest-group.conf" ||
                give_up "cannot write $dropin/ingest-group.conf"
            log "training ranks of group $ingest_group may report (ingest socket group)"
        else
            # the exporter still runs: only reports from non-members are refused
            log "ERROR: no group '$ingest_group' on this node: the ingest socket keeps group stepscope, and ranks of other users cannot report until they join it"
        fi
    fi
    systemctl daemon-reload >>"$LOG" 2>&1 || give_up "systemctl daemon-reload failed"
    systemctl enable --now stepscope.service >>"$LOG" 2>&1 ||
        give_up "systemctl enable --now stepscope failed (journalctl -u stepscope)"
    log "installed $("$ROOT$VENV/bin/stepscope" --version 2>&1) and started stepscope.service"
}

log "role $role, source $source_dir"
case "$role" in
    head)
        if [ "$hpc_job" = yes ]; then
            install_slurm_scripts || give_up "cannot install the Slurm prolog/epilog from $source_dir"
            log "installed the Slurm prolog/epilog (hpc_job)"
        else
            log "head node without --hpc-job: nothing to install"
        fi
        ;;
    compute)
        install_exporter
        ;;
esac
exit 0
