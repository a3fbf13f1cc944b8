#!/usr/bin/env bash
# Installs the Debian packages trident builds and tests with, when missing.
# As root: apt-get installs them. Otherwise: prints the exact command.
set -euo pipefail
pkgs=(build-essential pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
      libinih-dev libopenblas-openmp-dev libpcre2-dev libjansson-dev libxxhash-dev bible-kjv
      python3 procps)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
    echo "deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "deps: missing packages; run as root:"
    echo "  sudo sh -c '$cmd'"
    exit 1
fi
