#!/usr/bin/env bash
# build-images.sh: build the role images (trainer, cube, serving) from the repository's Dockerfile,
# one `--target <role>` each (the targets the Pulumi Images component builds), with a local engine.
# `make images` and the tests under tests/containers/ both run it.
#
#   1. Engine: eval "$(scripts/engine.sh start)": the daemon that already answers, else (root on
#      Debian) a private dockerd under the cache directory. It is left running: `make engine-stop`
#      (scripts/engine.sh stop) stops it, and only if engine.sh started it.
#   2. Base: the Dockerfile's default PYTHON_IMAGE when the engine has it or can pull it; otherwise
#      a local base built from this machine's Debian packages by scripts/base-image.sh (reused
#      when it exists), passed as --build-arg PYTHON_IMAGE=<local base>.
#   3. One snapshot of the build context (the repository's files that git does not ignore, under
#      <cache>/context), so that all the images come from one state of the tree even while it is
#      being edited.
#   4. DOCKER_BUILDKIT=0 docker build --network host --target <role> -t elastic-ctr-<role>:<tag>
#      -f <snapshot>/Dockerfile <snapshot>. The classic builder: Debian's docker.io has no buildx,
#      and the 28.x client on PATH refuses BuildKit without it. Host networking only (the private
#      engine has no bridge network). Note: the classic builder builds every stage above the
#      target, used or not; trainer, the Dockerfile's last stage, is built first, so on a cold
#      cache it builds all the stages and the other two targets then come from the cache.
#   5. Remove the untagged role images that earlier builds of these tags left behind.
#
# Usage: build-images.sh [ROLE...]    build these roles (default: trainer cube serving tracking; any other
#                                     target of the Dockerfile by name, e.g. serving-paddle, serving with
#                                     Paddle Inference, which make images adds)
#        build-images.sh --roles      print the roles (Dockerfile targets) it builds by default
# Environment:
#   IMAGE_TAG                   tag (default dev): elastic-ctr-<role>:<IMAGE_TAG>
#   PYTHON_IMAGE                use this base as is (no pull / local-base decision)
#   ELASTIC_CTR_BASE_IMAGE      name of the local base (default elastic-ctr/python:3.11-bookworm)
#   ELASTIC_CTR_PULL_TIMEOUT    seconds allowed for pulling the default base (default 120)
#   DOCKER_BUILD_FLAGS          extra `docker build` flags (e.g. --no-cache)
#   ELASTIC_CTR_SNAPSHOT=0      build from the repository itself, not from a snapshot of it
#   ELASTIC_CTR_KEEP_OLD=1      keep the untagged role images earlier builds left (see step 5)
#   ELASTIC_CTR_CACHE           cache directory (default <repo>/.cache/containers; see engine.sh)
# Output: progress on stderr (the full build log of each role in <cache>/logs/build-<role>.log,
# each line prefixed with the seconds since that build began); on stdout one summary line per
# image: `<image> <size in bytes> <seconds>`.
# Exit codes: 0 ok; 1 a build failed; 2 usage; 3 no engine and none can be started (engine.sh).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$SCRIPT_DIR/.." && pwd)
if [[ -z ${ELASTIC_CTR_CACHE:-} ]]; then
    ELASTIC_CTR_CACHE=$REPO/.cache/containers
fi
export ELASTIC_CTR_CACHE
CACHE=$ELASTIC_CTR_CACHE
ROLES=(trainer cube serving tracking)
TAG=${IMAGE_TAG:-dev}
LOCAL_BASE=${ELASTIC_CTR_BASE_IMAGE:-elastic-ctr/python:3.11-bookworm}
PULL_TIMEOUT=${ELASTIC_CTR_PULL_TIMEOUT:-120}
REPO_DOCKERFILE=$REPO/Dockerfile

log() { printf 'build-images.sh: %s\n' "$*" >&2; }
die() { local code=$1; shift; log "error: $*"; exit "$code"; }
now() { printf '%s' "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# Prefix each line of stdin with the seconds since $1 (an $EPOCHREALTIME value).
stamp() {
    local t0=${1/./} l d
    while IFS= read -r l || [[ -n $l ]]; do
        d=$(( (${EPOCHREALTIME/./} - t0) / 100000 ))
        printf '%5d.%d %s\n' $((d / 10)) $((d % 10)) "$l"
    done
}
mb() { awk -v s="$1" 'BEGIN { printf "%.0f MB", s / 1e6 }'; }

case ${1:-} in
    --roles) printf '%s\n' "${ROLES[@]}"; exit 0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    -*) echo "usage: $0 [ROLE...] | --roles" >&2; exit 2 ;;
esac
roles=("$@")
((${#roles[@]})) || roles=("${ROLES[@]}")
for r in "${roles[@]}"; do
    grep -qiE "^FROM[[:space:]].*[[:space:]]AS[[:space:]]+${r}[[:space:]]*\$" "$REPO_DOCKERFILE" ||
        die 2 "$REPO_DOCKERFILE has no stage '$r' (roles: ${ROLES[*]})"
done
[[ $TAG =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die 2 "IMAGE_TAG '$TAG' is not a valid tag"

t_all=$(now)

# 1. Engine.
t0=$(now)
engine_out=$("$SCRIPT_DIR/engine.sh" start) || exit $?
eval "$engine_out"
log "engine ready in $(since "$t0")s ($(sed -n 's/^# //p' <<<"$engine_out")); DOCKER_HOST=$DOCKER_HOST"

# One build at a time per cache directory (taken after engine.sh start: a dockerd it launches
# must not inherit the lock's file descriptor).
mkdir -p "$CACHE/logs"
exec 7>"$CACHE/build-images.lock"
if ! flock -n 7; then
    log "another build-images.sh is running with $CACHE: waiting for it"
    flock -w 3600 7 || die 1 "another build-images.sh still holds $CACHE/build-images.lock"
fi

# 2. One snapshot of the build context for every build. The tree may be edited while the builds
# run, and each `docker build` reads its context anew, so without it the images could come from
# different states of the tree. The snapshot holds the files git does not ignore (tracked or not),
# with their modes; the client applies .dockerignore to it as to the repository, and the layer
# cache keys on file contents, so an unchanged tree still hits the cache.
# ELASTIC_CTR_SNAPSHOT=0 (or no git work tree) builds from the repository itself.
CONTEXT=$REPO
if [[ ${ELASTIC_CTR_SNAPSHOT:-1} != 0 ]] && git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    CONTEXT=$CACHE/context
    rm -rf "$CONTEXT"
    mkdir -p "$CONTEXT"
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do if [[ -e $f || -L $f ]]; then printf '%s\0' "$f"; fi; done |
        tar --null -T - -cf -) | tar -C "$CONTEXT" -xf - || die 1 "cannot copy the build context to $CONTEXT"
    log "build context: a snapshot of $REPO in $CONTEXT ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(
        [[ -n $(git -C "$REPO" status --porcelain 2>/dev/null) ]] && printf ' + local changes'))"
fi
DOCKERFILE=$CONTEXT/Dockerfile

# 3. Base.
build_args=()
if [[ -n ${PYTHON_IMAGE:-} ]]; then
    base=$PYTHON_IMAGE
    log "base: $base (PYTHON_IMAGE, used as is)"
    build_args+=(--build-arg "PYTHON_IMAGE=$base")
else
    default_base=$(sed -n 's/^ARG[[:space:]]\{1,\}PYTHON_IMAGE=\([^[:space:]]*\).*/\1/p' "$DOCKERFILE" | head -n 1)
    [[ -n $default_base ]] || die 1 "no 'ARG PYTHON_IMAGE=<default>' line in $DOCKERFILE"
    if docker image inspect "$default_base" >/dev/null 2>&1; then
        base=$default_base
        log "base: $base (the Dockerfile's default, present in the engine)"
    elif pull_err=$(timeout "$PULL_TIMEOUT" docker pull -q "$default_base" 2>&1 >/dev/null); then
        base=$default_base
        log "base: $base (the Dockerfile's default, pulled)"
    else
        log "cannot pull the Dockerfile's default base $default_base: $(tail -n 1 <<<"$pull_err")"
        t0=$(now)
        base=$("$SCRIPT_DIR/base-image.sh" "$LOCAL_BASE") || die 1 "base-image.sh $LOCAL_BASE failed"
        log "base: $base (local, from this machine's Debian packages; ready in $(since "$t0")s)"
        build_args+=(--build-arg "PYTHON_IMAGE=$base")
    fi
fi

# 4. The role images.
extra=()
if [[ -n ${DOCKER_BUILD_FLAGS:-} ]]; then read -r -a extra <<<"$DOCKER_BUILD_FLAGS"; fi
summary=()
for role in "${roles[@]}"; do
    image=elastic-ctr-$role:$TAG
    blog=$CACHE/logs/build-$role.log
    log "docker build --target $role -t $image (log: $blog)"
    t0=$(now)
    # The log gets every line with the seconds since this build began; the terminal gets the steps.
    if ! DOCKER_BUILDKIT=0 docker build --network host --force-rm \
        --target "$role" -t "$image" -f "$DOCKERFILE" "${build_args[@]}" "${extra[@]}" "$CONTEXT" 2>&1 |
        stamp "$t0" | tee "$blog" |
        { grep --line-buffered -E '^ *[0-9.]+ (Step [0-9]+/[0-9]+ : (FROM|RUN)|Successfully tagged)' >&2 || true; }; then
        tail -n 40 "$blog" >&2
        die 1 "docker build --target $role failed (log: $blog)"
    fi
    secs=$(since "$t0")
    size=$(docker image inspect --format '{{.Size}}' "$image")
    log "built $image: $(mb "$size") in ${secs}s"
    summary+=("$image $size $secs")
done

# 5. The role images these tags pointed at before (now untagged): each rebuild after a code change
# adds a new copy of the role's venv (about 1 GB for trainer and serving), so without this the
# data root grows by about 2.5 GB per change. Only untagged images with this project's entrypoint
# and user are removed, never one a container uses (no --force). ELASTIC_CTR_KEEP_OLD=1 keeps them.
if [[ ${ELASTIC_CTR_KEEP_OLD:-0} != 1 ]]; then
    removed=0
    while IFS= read -r id; do
        [[ -n $id ]] || continue
        what=$(docker image inspect --format '{{.Config.User}} {{json .Config.Entrypoint}}' "$id" 2>/dev/null) || continue
        [[ $what == '10001:10001 ["elastic-ctr"]' ]] || continue
        if docker rmi "$id" >/dev/null 2>&1; then removed=$((removed + 1)); fi
    done < <(docker images --filter dangling=true --quiet --no-trunc)
    if ((removed)); then log "removed $removed untagged earlier role image(s)"; fi
fi
log "all done in $(since "$t_all")s (base $base); the engine is left running: scripts/engine.sh stop (make engine-stop)"
printf '%s\n' "${summary[@]}"
