#!/bin/bash
# Build what install-stepscope.sh installs from, on a machine with access to PyPI:
#
#   deploy/parallelcluster/build-wheelhouse.sh [--extras auth,...] OUT [PYTHON_VERSION...]
#   aws s3 sync OUT s3://BUCKET/stepscope/        # or copy OUT to a shared filesystem
#
# --extras   optional features the nodes install too, as pip extras of stepscope:
#            auth (bcrypt, for basic_auth_users in --web-config), aws, kubernetes.
#            Their wheels go into the wheelhouse and OUT/extras names them, which
#            install-stepscope.sh reads: the nodes install stepscope[auth].
#
# OUT gets stepscope.service, the Slurm prolog/epilog, install-stepscope.sh and
# wheelhouse/: the stepscope wheel built from this checkout, binary wheels of every
# dependency for each PYTHON_VERSION (default: 3.10 3.11 3.12, the Pythons of Ubuntu
# 22.04, the python3.11 package of Amazon Linux 2023 / RHEL / Rocky, Ubuntu 24.04) on
# x86_64 and aarch64 (wheels for glibc 2.17 to 2.28: every supported image has 2.28 or
# newer), and pip's wheel, which the nodes run pip from. Run with a Python >= 3.10 that
# has pip. The container image installs from the same wheelhouse when built offline
# (the Dockerfile's WHEELHOUSE build argument).
set -euo pipefail

usage="usage: build-wheelhouse.sh [--extras auth,...] OUT [PYTHON_VERSION...]"
extras="${EXTRAS:-}"
if [ "${1:-}" = --extras ]; then
    extras="${2:?$usage}"
    shift 2
fi
case "$extras" in
    *[!a-z0-9,_-]*) echo "build-wheelhouse.sh: --extras takes names such as auth or auth,aws, got '$extras'" >&2; exit 2 ;;
esac
out="${1:?$usage}"
shift
versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then versions=(3.10 3.11 3.12); fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PYTHON:-python3}"
wheelhouse="$out/wheelhouse"
mkdir -p "$wheelhouse"

"$py" -m pip wheel --no-deps --wheel-dir "$wheelhouse" "$repo"
stepscope_wheel="$(find "$wheelhouse" -maxdepth 1 -name 'stepscope-*.whl' | sort -V | tail -n 1)"
requirement="$stepscope_wheel${extras:+[$extras]}"
for version in "${versions[@]}"; do
    for arch in x86_64 aarch64; do
        # pip matches each --platform tag exactly: name every glibc from 2.17 to 2.28, or
        # a wheel tagged only manylinux_2_17 (grpcio, for the kubernetes extra) is missed
        platforms=(--platform "manylinux2014_$arch")
        for glibc in {17..28}; do platforms+=(--platform "manylinux_2_${glibc}_$arch"); done
        "$py" -m pip download --only-binary=:all: --python-version "$version" \
            "${platforms[@]}" --dest "$wheelhouse" "$requirement"
    done
done
if [ -n "$extras" ]; then echo "$extras" >"$out/extras"; else rm -f "$out/extras"; fi
"$py" -m pip download --only-binary=:all: --no-deps --dest "$wheelhouse" pip

cp "$repo/systemd/stepscope.service" "$here/install-stepscope.sh" \
    "$here/slurm-prolog.sh" "$here/slurm-epilog.sh" "$out/"
echo "$out: $(find "$wheelhouse" -name '*.whl' | wc -l) wheels${extras:+, extras $extras}"
