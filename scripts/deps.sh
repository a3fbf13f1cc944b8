#!/usr/bin/env bash
# Installs what trident builds and tests with, when missing:
#  1. Debian packages. As root: apt-get installs them. Otherwise: prints the
#     exact command and exits 1.
#     Slurm (slurmctld, slurmd, slurm-client, munge) is for tests/e2e/slurm.sh,
#     which starts its own daemons; the packages' postinst must not start any:
#     without a /usr/sbin/policy-rc.d (Docker images ship one that says 101,
#     "action forbidden"), one is put there for the install and removed after,
#     so invoke-rc.d starts nothing, with or without systemd.
#  2. The test suite's Python packages (tests/requirements.txt, pinned) in a
#     project-local virtual environment, .venv/ at the repo root (gitignored),
#     made with Debian's python3 -m venv; tests/e2e/lib/common.sh runs
#     .venv/bin/python. The system Python is never touched.
#  3. Hugging Face transformers for tests/e2e/hf_transformers.sh in a second
#     venv, .venv-hf/ (gitignored): PyPI's torch and transformers pinned in
#     tests/requirements-hf.txt (it says why a second venv and why not
#     Debian's python3-torch, which tests/reference scripts still use).
# Quick and silent when everything is present: one dpkg-query, and each
# venv's record of the requirements it was built from compared with the file.
# Usage: scripts/deps.sh [packages|venvs] (default: both, 1 then 2 and 3).
# `make test` runs `packages` first (the builds need their headers), then
# `venvs` (downloads: mostly network and disk) while it builds.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case $what in
    all|packages|venvs) ;;
    *) echo "usage: scripts/deps.sh [packages|venvs]" >&2; exit 2 ;;
esac
pkgs=(build-essential pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
      libinih-dev libopenblas-openmp-dev libdnnl-dev libpcre2-dev libjansson-dev libxxhash-dev libutf8proc-dev libisal-dev bible-kjv
      python3 python3-venv python3-torch jq procps slurmctld slurmd slurm-client munge gnuplot-nox
      ccache)
# dpkg-query exits 1 when it knows none of a name (a fresh machine): not an error here
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${pkgs[@]}" 2>/dev/null | awk '/ install ok installed$/ {print $1}' || true)
missing=()
[ "$what" = venvs ] ||
    for p in "${pkgs[@]}"; do grep -qx -- "$p" <<<"$installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "deps: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        policy=/usr/sbin/policy-rc.d
        if [ ! -e "$policy" ]; then
            printf '#!/bin/sh\n# trident scripts/deps.sh: no service starts during the install\nexit 101\n' > "$policy"
            chmod 755 "$policy"
            trap 'rm -f "$policy"' EXIT
        fi
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        echo "deps: missing packages; run as root:"
        echo "  sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends ${missing[*]}'"
        exit 1
    fi
fi

# make_venv DIR REQUIREMENTS IMPORTS [venv options]: DIR made (or made anew when
# its REQUIREMENTS changed: no package of an older list stays) with the pinned
# REQUIREMENTS, then IMPORTS (a Python statement) run in it
make_venv() {
    local venv=$1 req=$2 imports=$3; shift 3
    if [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/trident-requirements.txt"; then return 0; fi
    echo "deps: making $venv with $(/usr/bin/python3 --version) and $req"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$@" "$venv"
    # --no-compile: no .pyc for the thousands of modules never imported (torch's:
    # ~19 CPU s); Python writes those of the modules the tests import on first use
    "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check --only-binary :all: \
        -r "$req"
    "$venv/bin/python" -c "$imports"
    cp "$req" "$venv/trident-requirements.txt"
}
[ "$what" = packages ] && exit 0
make_venv .venv tests/requirements.txt "import h5py, numpy, tokenizers, tensorboard, prometheus_client"
make_venv .venv-hf tests/requirements-hf.txt "import torch, transformers, safetensors, tokenizers; \
torch.from_numpy(__import__('numpy').zeros(2))"
