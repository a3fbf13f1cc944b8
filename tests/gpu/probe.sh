#!/usr/bin/env bash
# probe.sh DIR: finds cuDNN and NCCL (headers and libraries) for `make CUDA=1`
# on a machine whose CUDA toolkit may lack them, and writes what it found as
# make variables into DIR/cuda_deps.mk (one `NAME := VALUE` a line, included
# by nothing: tests/gpu/run.sh passes them on make's command line):
#   CUDNN_INC, NCCL_INC   folders holding cudnn.h (with cudnn_version.h) and nccl.h;
#   CUDNN_LIB, NCCL_LIB   folders holding libcudnn.so[.9] and libnccl.so[.2]
#                         (the Makefile links against them with an rpath there);
#   CUDA_SHIMS            DIR/shims: unversioned links (libcudnn.so ->
#                         .../libcudnn.so.9) for libraries found only under
#                         their versioned name, as the Python wheels
#                         nvidia-cudnn-cu13 and nvidia-nccl-cu13 ship them (the
#                         linker's -lcudnn needs libcudnn.so; the binary
#                         records the soname, libcudnn.so.9, found at run
#                         time through the rpath).
# A variable is empty when the compiler or linker finds the thing by itself
# (CUDA_HOME's include and lib64, which the Makefile already names, or the
# system's default folders).
#
# Searched, in order, for each of cudnn.h, nccl.h, libcudnn and libnccl:
#   1. CUDA_HOME (default /usr/local/cuda): include, lib64, lib,
#      targets/x86_64-linux/{include,lib};
#   2. the system: /usr/include, /usr/include/x86_64-linux-gnu,
#      /usr/local/include, /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib,
#      /usr/local/lib (PROBE_SYSTEM_DIRS replaces this list: the tests' way
#      of having a machine without them);
#   3. every Python site-packages folder: TRIDENT_SITE_PACKAGES (folders
#      separated by ':') when set, else those python3 reports
#      (site.getsitepackages() and the user's) and the usual
#      /usr/lib/python3/dist-packages, /usr/local/lib/python3.*/dist-packages;
#      in each, nvidia/cudnn/{include,lib} and nvidia/nccl/{include,lib}
#      (and nvidia/cu13/{include,lib}, where CUDA 13's toolkit wheels go).
# Header and library come from one place (the first holding both).
#
# Prints "result: " lines (what was found, versions from the headers, where)
# and exits 0; exits 1 within seconds when either is missing, naming every
# folder searched for what is missing. Needs only bash, sed and ls.
set -u
DIR=${1:?usage: tests/gpu/probe.sh DIR (writes DIR/cuda_deps.mk and DIR/shims)}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SYSTEM_DIRS=${PROBE_SYSTEM_DIRS-/usr/include:/usr/include/x86_64-linux-gnu:/usr/local/include:/usr/lib/x86_64-linux-gnu:/usr/lib64:/usr/lib:/usr/local/lib}
# What the compiler and linker search without being told (no -I/-L needed).
DEFAULT_DIRS=":$CUDA_HOME/include:$CUDA_HOME/lib64:/usr/include:/usr/include/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/usr/lib64:/usr/lib:/lib/x86_64-linux-gnu:"

# Candidate prefixes: each holds include/ and lib/ (or lib64/) folders.
site_dirs() {
    if [ -n "${TRIDENT_SITE_PACKAGES+x}" ]; then
        tr ':' '\n' <<<"$TRIDENT_SITE_PACKAGES"
        return
    fi
    local py
    for py in python3 /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        timeout 5 "$py" -c 'import site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]: print(d)' 2>/dev/null
    done
    ls -d /usr/lib/python3/dist-packages /usr/local/lib/python3.*/dist-packages 2>/dev/null
}

mapfile -t SITES < <(site_dirs | awk 'NF && !seen[$0]++')
# The places searched, in order: "INCLUDE_DIRS|LIB_DIRS" (each ':'-separated).
PLACES=("$CUDA_HOME/include|$CUDA_HOME/lib64:$CUDA_HOME/lib"
        "$CUDA_HOME/targets/x86_64-linux/include|$CUDA_HOME/targets/x86_64-linux/lib")
sys_inc="" sys_lib=""
IFS=: read -ra sys <<<"$SYSTEM_DIRS"
for d in "${sys[@]}"; do
    [ -n "$d" ] || continue
    case $d in */include*) sys_inc+=${sys_inc:+:}$d ;; *) sys_lib+=${sys_lib:+:}$d ;; esac
done
[ -n "$sys_inc$sys_lib" ] && PLACES+=("$sys_inc|$sys_lib")

# find_pair NAME HEADER LIB: sets FOUND_INC, FOUND_LIB and FOUND_SO (the file
# to link: LIB.so, else LIB.so.N) from the first place holding both the
# header and the library (CUDA_HOME, the system, then each site-packages'
# nvidia/NAME and nvidia/cu13), so that they are of one installation;
# SEARCHED lists every file pattern looked for, PARTIAL where only one of
# the two was.
find_pair() {
    local name=$1 header=$2 lib=$3 place s d so inc libd incs libs
    FOUND_INC="" FOUND_LIB="" FOUND_SO="" SEARCHED=() PARTIAL=()
    local places=("${PLACES[@]}")
    for s in "${SITES[@]}"; do
        places+=("$s/nvidia/$name/include|$s/nvidia/$name/lib" "$s/nvidia/cu13/include|$s/nvidia/cu13/lib")
    done
    for place in "${places[@]}"; do
        IFS=: read -ra incs <<<"${place%%|*}"
        IFS=: read -ra libs <<<"${place#*|}"
        inc="" libd="" so=""
        for d in "${incs[@]}"; do
            SEARCHED+=("$d/$header")
            [ -z "$inc" ] && [ -f "$d/$header" ] && inc=$d
        done
        for d in "${libs[@]}"; do
            SEARCHED+=("$d/$lib.so*")
            [ -n "$libd" ] && continue
            if [ -e "$d/$lib.so" ]; then so=$lib.so
            else so=$(cd "$d" 2>/dev/null && ls "$lib".so.[0-9]* 2>/dev/null | sort -V | head -n1)
            fi
            [ -n "$so" ] && libd=$d FOUND_SO=$so
        done
        if [ -n "$inc" ] && [ -n "$libd" ]; then FOUND_INC=$inc FOUND_LIB=$libd; return 0; fi
        [ -n "$inc" ] && PARTIAL+=("$inc/$header without $lib.so* beside it")
        [ -n "$libd" ] && PARTIAL+=("$libd/$FOUND_SO without $header beside it")
        FOUND_SO=""
    done
    return 1
}

# version HEADER MACRO_PREFIX: "MAJOR.MINOR.PATCH" from #defines.
version() {
    local f=$1 p=$2 maj min pat
    maj=$(sed -n "s/^#define ${p}MAJOR[[:space:]]\{1,\}\([0-9]*\).*/\1/p" "$f" | head -n1)
    min=$(sed -n "s/^#define ${p}MINOR[[:space:]]\{1,\}\([0-9]*\).*/\1/p" "$f" | head -n1)
    pat=$(sed -n "s/^#define ${p}PATCH\(LEVEL\)\{0,1\}[[:space:]]\{1,\}\([0-9]*\).*/\2/p" "$f" | head -n1)
    echo "${maj:-?}.${min:-?}.${pat:-?}"
}

mkdir -p "$DIR" || exit 1
SHIMS=$DIR/shims
rm -rf "$SHIMS" && mkdir -p "$SHIMS" || exit 1
missing=0
need_shims=0
declare -A VARS=()
for spec in "cudnn cudnn.h libcudnn CUDNN cudnn_version.h CUDNN_" "nccl nccl.h libnccl NCCL nccl.h NCCL_"; do
    read -r name header lib var vh vp <<<"$spec"
    if ! find_pair "$name" "$header" "$lib"; then
        missing=1
        echo "result: $name MISSING: no place holds both $header and $lib.so* (CUDA_HOME=$CUDA_HOME; Python site-packages: ${SITES[*]:-none}); searched:"
        printf '    %s\n' "${SEARCHED[@]}"
        [ ${#PARTIAL[@]} -gt 0 ] && printf '    half found: %s\n' "${PARTIAL[@]}"
        continue
    fi
    ver=$(version "$FOUND_INC/$vh" "$vp")
    echo "result: $name $ver: $FOUND_INC/$header, $FOUND_LIB/$FOUND_SO"
    inc=$FOUND_INC libdir=$FOUND_LIB
    case $DEFAULT_DIRS in *":$inc:"*) inc="" ;; esac
    case $DEFAULT_DIRS in *":$libdir:"*) libdir="" ;; esac
    VARS[${var}_INC]=$inc
    VARS[${var}_LIB]=$libdir
    if [ "$FOUND_SO" != "$lib.so" ]; then # only versioned: a link for -l$name
        ln -sfn "$FOUND_LIB/$FOUND_SO" "$SHIMS/$lib.so" || exit 1
        echo "result: $name: link shim $SHIMS/$lib.so -> $FOUND_LIB/$FOUND_SO (rpath $FOUND_LIB)"
        need_shims=1
    fi
done
if [ "$missing" = 1 ]; then
    echo "probe: cuDNN or NCCL missing: install them in CUDA_HOME, the system, or as the Python wheels nvidia-cudnn-cu13 / nvidia-nccl-cu13 (or name their site-packages in TRIDENT_SITE_PACKAGES)"
    exit 1
fi
{
    for v in CUDNN_INC CUDNN_LIB NCCL_INC NCCL_LIB; do echo "$v := ${VARS[$v]}"; done
    echo "CUDA_SHIMS := $([ "$need_shims" = 1 ] && echo "$SHIMS")"
} >"$DIR/cuda_deps.mk"
echo "result: make variables: $(sed 's/ := /=/; s/ *$//' "$DIR/cuda_deps.mk" | paste -sd' ' -)"
exit 0
