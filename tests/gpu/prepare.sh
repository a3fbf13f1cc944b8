#!/usr/bin/env bash
# prepare.sh: run HERE (a Debian 12 machine with trident's packages
# installed, network to the Debian mirrors), before tests/gpu/run.sh is
# shipped to a GPU machine that cannot reach any network. Downloads into
# tests/gpu/debs/ (ignored by git) the .deb files that machine lacks:
#   - the -dev packages trident builds against (headers, .so links, .pc files),
#     OpenMPI's launcher (openmpi-bin, openmpi-common) and pkgconf;
#   - every library the binaries and OpenMPI/PMIx plugins load, found with
#     ldd on this machine's build and mapped to packages with dpkg -S, less the
#     base libraries any machine that runs nvcc has (libc6, libgcc-s1,
#     libstdc++6).
# run.sh unpacks them with dpkg -x into a prefix under /tmp. Needs a build
# first, for the ldd walk (any of make, make EMU=1 BUILD=build-emu or make
# CUDA=1 BUILD=build-cuda: they link the same Debian libraries; BUILD= says
# which). Prints the total size: the device tool
# carries at most 64 MiB of ignored files.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
DEBS=tests/gpu/debs
[ -x "$BUILD/trident" ] || { echo "prepare: build first (make); $BUILD/trident is missing" >&2; exit 1; }

dev=(libopenmpi-dev openmpi-bin openmpi-common libhdf5-dev libinih-dev libopenblas-openmp-dev libdnnl-dev
     libpcre2-dev libjansson-dev libxxhash-dev libutf8proc-dev libisal-dev pkgconf pkgconf-bin libpkgconf3
     zlib1g-dev)
skip=" libc6 libgcc-s1 libstdc++6 "

# The package owning a file, trying the merged-/usr spellings of its path
# (ldd says /lib/x86_64-linux-gnu/..., dpkg knows /usr/lib/...; alternatives
# such as libopenblas.so.0 resolve through readlink -f). Empty when none.
owner() {
    local p=$1 q r
    for q in "$p" "$(readlink -f "$p")" "/usr${p#/usr}" "${p#/usr}"; do
        r=$(dpkg -S "$q" 2>/dev/null | head -n1 | cut -d: -f1 || true)
        [ -n "$r" ] && { echo "$r"; return 0; }
    done
    return 0
}

mapfile -t objs < <(ls "$BUILD/trident" "$BUILD"/tests/test_* "$BUILD"/mpi/test_* /usr/bin/orterun /usr/bin/orted \
    /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so \
    2>/dev/null)
declare -A pkgs=()
for p in "${dev[@]}"; do pkgs[$p]=1; done
while read -r lib; do
    [ -n "$lib" ] || continue
    p=$(owner "$lib")
    case "$p:$lib" in
        :/usr/local/cuda* | :*/site-packages/nvidia/* | :*/dist-packages/nvidia/*) ;; # the GPU machine's CUDA toolkit, cuDNN and NCCL (tests/gpu/probe.sh)
        :*) echo "prepare: WARNING: no package owns $lib (linked by a binary)" >&2 ;;
    esac
    [ -n "$p" ] && [[ "$skip" != *" $p "* ]] && pkgs[$p]=1
done < <(for o in "${objs[@]}"; do # (set -e holds in here: a .d file must not end the walk)
             case $o in *.d) continue ;; esac
             ldd "$o" 2>/dev/null | awk '/=> \//{print $3}' || true
         done | sort -u)
for o in /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_btl_vader.so \
         /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_prm_default.so; do
    p=$(owner "$o"); [ -n "$p" ] && pkgs[$p]=1 # the plugins' own packages
done

mkdir -p "$DEBS"
names=("${!pkgs[@]}")
echo "prepare: ${#names[@]} packages: ${names[*]}"
cd "$DEBS"
rm -f ./*.deb
if ! apt-get download "${names[@]}" >/dev/null; then
    echo "prepare: apt-get download failed; refreshing the package lists" >&2
    apt-get update -qq
    apt-get download "${names[@]}" >/dev/null
fi
ls ./*.deb | wc -l | xargs echo "prepare: downloaded .deb files:"
du -sh . | awk '{print "prepare: total " $1}'
kb=$(du -sk . | cut -f1)
[ "$kb" -le $((60 * 1024)) ] || echo "prepare: WARNING: over 60 MiB; the device tool carries 64 MiB in all" >&2
