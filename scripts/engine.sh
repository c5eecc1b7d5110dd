#!/usr/bin/env bash
# engine.sh: make a Docker engine available for local image builds and container runs.
#
#   engine.sh start   use the Docker daemon that already answers (DOCKER_HOST, docker context or
#                     the default socket); otherwise (root on Debian only) install Debian's
#                     docker.io if dockerd is missing and start a private dockerd whose state,
#                     socket, pid files and log all live under the cache directory. Prints
#                     `export DOCKER_HOST=...` on stdout (progress goes to stderr), so
#                     `eval "$(engine.sh start)"` works, and a comment line saying whether this
#                     call started the daemon: `# engine=started|running|existing pid=N`
#                     (started: this call launched it; running: ours, from an earlier start;
#                     existing: a daemon this script did not start).
#   engine.sh env     print `export DOCKER_HOST=...` for the running engine (ours or an existing one)
#   engine.sh stop    stop the daemon only if this script started it (and its containerd and
#                     container shims); a no-op otherwise
#   engine.sh status  say which engine is in use, if any
#
# The private daemon uses host networking only (--bridge=none --iptables=false --ip-masq=false):
# it never creates interfaces or firewall rules. Containers and builds must therefore use
# `--network host` (`docker run --network host`, `docker build --network host`).
#
# Environment:
#   ELASTIC_CTR_CACHE           cache directory (default: <repo>/.cache/containers)
#   ELASTIC_CTR_ENGINE_TIMEOUT  seconds to wait for the daemon to answer (default 60)
#   ELASTIC_CTR_STOP_TIMEOUT    seconds to wait after SIGTERM before SIGKILL (default 30)
#
# Exit codes: 0 ok; 1 failure (daemon did not come up, install failed, ...); 2 usage;
#             3 no daemon answers and this machine/user cannot start one (not root, not Debian).
# Requires: bash, flock, setsid, timeout (util-linux, coreutils), the docker client.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
if [[ -z ${ELASTIC_CTR_CACHE:-} ]]; then
    ELASTIC_CTR_CACHE=$(cd -- "$SCRIPT_DIR/.." && pwd)/.cache/containers   # scripts/ is at the repository root
fi
CACHE=$ELASTIC_CTR_CACHE
START_TIMEOUT=${ELASTIC_CTR_ENGINE_TIMEOUT:-60}
STOP_TIMEOUT=${ELASTIC_CTR_STOP_TIMEOUT:-30}

STATE_FILE=$CACHE/engine.state          # written by start: OWNED, PID, DOCKER_HOST
DATA_ROOT=$CACHE/docker                 # images, layers, build cache (persist across starts)
LOG_FILE=$CACHE/dockerd.log
DAEMON_JSON=$CACHE/daemon.json          # our config: never pick up the host's /etc/docker/daemon.json

# Unix socket paths are limited to 107 bytes; containerd puts sockets a few levels below the exec
# root. Keep the run directory under the cache when the path is short enough, else use a short
# directory under /run named after a hash of the cache path.
RUN_DIR=$CACHE/run
if (( ${#RUN_DIR} > 60 )); then
    RUN_DIR=/run/elastic-ctr-$(printf '%s' "$CACHE" | cksum | cut -d' ' -f1)
fi
EXEC_ROOT=$RUN_DIR/exec
SOCKET=$RUN_DIR/docker.sock
PID_FILE=$RUN_DIR/dockerd.pid
OUR_HOST=unix://$SOCKET
# Containers of our daemon go in their own cgroup, so that processes left behind by a crashed
# daemon can be found (and only ours).
CGROUP_PARENT=elastic-ctr-$(printf '%s' "$CACHE" | cksum | cut -d' ' -f1)

log() { printf 'engine.sh: %s\n' "$*" >&2; }
die() { local code=$1; shift; log "error: $*"; exit "$code"; }

# `docker info` against a given DOCKER_HOST ("" = the client's own default/context).
docker_answers() {
    command -v docker >/dev/null 2>&1 || return 1
    if [[ -n $1 ]]; then
        DOCKER_HOST=$1 timeout 15 env -u DOCKER_API_VERSION docker info >/dev/null 2>&1
    else
        (unset DOCKER_HOST DOCKER_API_VERSION; timeout 15 docker info >/dev/null 2>&1)
    fi
}

# The endpoint the client uses when DOCKER_HOST is unset (docker context, else the default socket).
default_host() {
    local h=""
    h=$( (unset DOCKER_HOST; docker context inspect --format '{{.Endpoints.docker.Host}}' 2>/dev/null) || true)
    printf '%s' "${h:-unix:///var/run/docker.sock}"
}

# Is PID a live dockerd started with our pidfile? (guards against a recycled PID)
is_our_dockerd() {
    local pid=$1
    [[ -n $pid && -d /proc/$pid ]] || return 1
    [[ $(basename "$(readlink "/proc/$pid/exe" 2>/dev/null || true)") == dockerd ]] || return 1
    { tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qxF -- "$PID_FILE"
}

read_state() {
    STATE_OWNED="" STATE_PID="" STATE_HOST=""
    [[ -f $STATE_FILE ]] || return 1
    while IFS='=' read -r k v; do
        case $k in
            OWNED) STATE_OWNED=$v ;;
            PID) STATE_PID=$v ;;
            DOCKER_HOST) STATE_HOST=$v ;;
        esac
    done <"$STATE_FILE"
}

write_state() {  # OWNED PID DOCKER_HOST
    # A cache this user cannot write (someone else's checkout): record nothing; `stop` is then a no-op.
    if ((!CACHE_WRITABLE)); then return 0; fi
    mkdir -p "$CACHE"
    printf 'OWNED=%s\nPID=%s\nDOCKER_HOST=%s\n' "$1" "$2" "$3" >"$STATE_FILE.tmp"
    mv -f "$STATE_FILE.tmp" "$STATE_FILE"
}

# PIDs (children of dockerd or orphans) of the containerd and shims that belong to our daemon:
# their command line names our containerd socket or config under our exec root.
our_containerd_pids() {
    local p args
    for p in /proc/[0-9]*; do
        args=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
        case $args in
            *"$EXEC_ROOT/containerd/"*) printf '%s\n' "${p#/proc/}" ;;
        esac
    done
}

# PIDs of container processes in our cgroup parent (any cgroup v1 hierarchy, or v2).
our_container_pids() {
    local d
    for d in /sys/fs/cgroup/"$CGROUP_PARENT" /sys/fs/cgroup/*/"$CGROUP_PARENT"; do
        [[ -d $d ]] || continue
        find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
    done | sort -un
}

# Unmount what our daemon left mounted under its data root and exec root (after a crash or a
# SIGKILL it leaves the data root's own bind mount, netns and container mounts behind): deepest first.
unmount_ours() {
    local m
    awk '{print $5}' /proc/self/mountinfo | while IFS= read -r m; do
        m=$(printf '%b' "${m//\\/\\0}")   # mountinfo escapes spaces etc. as \040
        case $m in "$DATA_ROOT" | "$DATA_ROOT"/* | "$RUN_DIR" | "$RUN_DIR"/*) printf '%s\n' "$m" ;; esac
    done | awk '{print length, $0}' | sort -rn | cut -d' ' -f2- | while IFS= read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
    done
}

alive() { [[ -d /proc/$1 ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# SIGTERM the given PIDs, wait up to $1 seconds, then SIGKILL what is left.
term_then_kill() {
    local bound=$1; shift
    local pids=("$@") p left i
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < bound * 10; i++)); do
        left=0
        for p in "${pids[@]}"; do alive "$p" && left=1; done
        ((left)) || return 0
        sleep 0.1
    done
    for p in "${pids[@]}"; do
        if alive "$p"; then log "pid $p still running after ${bound}s: SIGKILL"; kill -KILL "$p" 2>/dev/null || true; fi
    done
    sleep 0.2
}

# One start/stop at a time per cache directory (fd 8; the daemon must not inherit it).
# A cache directory this user cannot write is not an error while an existing daemon can be used.
CACHE_WRITABLE=1
lock() {
    if ! mkdir -p "$CACHE" 2>/dev/null || ! touch "$CACHE/engine.lock" 2>/dev/null; then
        CACHE_WRITABLE=0
        log "warning: cannot write $CACHE (uid $(id -u)): no state recorded"
        return 0
    fi
    exec 8>"$CACHE/engine.lock"
    flock -w 300 8 || die 1 "another engine.sh start/stop holds $CACHE/engine.lock"
}

# `export DOCKER_HOST=HOST`, and with ORIGIN (started|running|existing) and PID the comment line
# `# engine=ORIGIN pid=PID` that tells a caller whether this call started the daemon.
# The client negotiates the API version down by itself (the 28.x client talks API 1.41 to
# Debian's 20.10 daemon), unless DOCKER_API_VERSION pins a newer one: then pin the daemon's.
print_env() {  # HOST [ORIGIN [PID]]
    if [[ -n ${2:-} ]]; then printf '# engine=%s pid=%s\n' "$2" "${3:-}"; fi
    printf 'export DOCKER_HOST=%s\n' "$1"
    if [[ -n ${DOCKER_API_VERSION:-} ]]; then
        local srv
        srv=$(DOCKER_HOST=$1 env -u DOCKER_API_VERSION docker version --format '{{.Server.APIVersion}}' 2>/dev/null || true)
        if [[ -n $srv && $(printf '%s\n%s\n' "$srv" "$DOCKER_API_VERSION" | sort -V | tail -n1) != "$srv" ]]; then
            log "DOCKER_API_VERSION=$DOCKER_API_VERSION is newer than the daemon's API $srv: pinning $srv"
            printf 'export DOCKER_API_VERSION=%s\n' "$srv"
        fi
    fi
}

install_docker() {
    log "dockerd not found: installing Debian's docker.io (apt-get)"
    local policy=/usr/sbin/policy-rc.d created_policy=0
    # Never let the package's maintainer scripts start a system dockerd/containerd (that one would
    # create docker0 and iptables rules on the host): deny service starts during the install.
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && created_policy=1
    fi
    local rc=0 apt_log=$CACHE/apt-docker.log
    mkdir -p "$CACHE"
    {
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q &&
            apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 docker.io
    } >"$apt_log" 2>&1 || rc=$?
    if ((created_policy)); then rm -f "$policy"; fi
    if ((rc != 0)); then
        tail -n 20 "$apt_log" >&2
        die 1 "apt-get install docker.io failed (exit $rc; log: $apt_log)"
    fi
    log "installed $(dpkg-query -W -f '${Package} ${Version}' docker.io 2>/dev/null) (log: $apt_log)"
    command -v dockerd >/dev/null 2>&1 || die 1 "docker.io installed but dockerd is still not on PATH"
}

cmd_start() {
    # 1. Our own daemon from an earlier start? A busy daemon (a build under load) can be slow to
    # answer: give it the start timeout before deciding that it is stuck and restarting it.
    if read_state && [[ $STATE_OWNED == 1 ]] && is_our_dockerd "$STATE_PID"; then
        local t0=$SECONDS
        while is_our_dockerd "$STATE_PID" && ((SECONDS - t0 < START_TIMEOUT)); do
            if docker_answers "$OUR_HOST"; then
                log "our dockerd (pid $STATE_PID) is already running"
                print_env "$OUR_HOST" running "$STATE_PID"
                return 0
            fi
            log "our dockerd (pid $STATE_PID) does not answer yet: waiting"
            sleep 1
        done
    fi
    # 2. A daemon that already answers: use it, and remember that we did not start it.
    local host=${DOCKER_HOST:-}
    if docker_answers "$host"; then
        [[ -n $host ]] || host=$(default_host)
        local sockpid
        sockpid=$(cat "$PID_FILE" 2>/dev/null || true)
        if [[ $host == "$OUR_HOST" ]] && is_our_dockerd "$sockpid"; then
            # Our socket, our pid file, but the state file was lost: it is ours.
            log "our dockerd (pid $sockpid) is already running"
            write_state 1 "$sockpid" "$OUR_HOST"
            print_env "$host" running "$sockpid"
        else
            log "using the Docker daemon that already answers at $host (not started by this script)"
            write_state 0 "" "$host"
            print_env "$host" existing ""
        fi
        return 0
    fi
    # 3. Start our own: root on Debian only.
    if [[ $(id -u) -ne 0 ]]; then
        die 3 "no Docker daemon answers (DOCKER_HOST=${DOCKER_HOST:-<unset>}) and this script can only start one as root (uid $(id -u)); start a daemon yourself, or run as root"
    fi
    if [[ ! -f /etc/debian_version ]] || ! command -v apt-get >/dev/null 2>&1; then
        die 3 "no Docker daemon answers and this is not a Debian system (no /etc/debian_version or apt-get): install and start Docker yourself"
    fi
    ((CACHE_WRITABLE)) || die 1 "cannot write the cache directory $CACHE (set ELASTIC_CTR_CACHE)"
    command -v dockerd >/dev/null 2>&1 || install_docker
    command -v docker >/dev/null 2>&1 || die 1 "no docker client on PATH"

    mkdir -p "$CACHE" "$DATA_ROOT" "$RUN_DIR" "$EXEC_ROOT"
    chmod 0711 "$RUN_DIR"

    # A stale daemon of ours that no longer answers (or a stale pid file): end it cleanly first.
    local old
    old=$(cat "$PID_FILE" 2>/dev/null || true)
    if is_our_dockerd "$old"; then
        log "our dockerd (pid $old) does not answer: stopping it before restarting"
        term_then_kill "$STOP_TIMEOUT" "$old"
    fi
    mapfile -t old < <(our_containerd_pids)
    if ((${#old[@]})); then
        log "leftover containerd/shim processes of ours: ${old[*]}: ending them"
        term_then_kill 10 "${old[@]}"
    fi
    mapfile -t old < <(our_container_pids)
    if ((${#old[@]})); then
        log "leftover container processes of ours: ${old[*]}: ending them"
        term_then_kill 10 "${old[@]}"
    fi
    unmount_ours
    rm -f "$PID_FILE" "$SOCKET"

    # Our own config file (never the host's /etc/docker/daemon.json). Docker < 23 writes an
    # identity key to /etc/docker/key.json unless its config says otherwise: keep it here.
    local major
    major=$(dockerd --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')
    if [[ -n $major ]] && ((major < 23)); then
        printf '{\n  "deprecated-key-path": "%s"\n}\n' "$CACHE/key.json" >"$DAEMON_JSON"
    else
        printf '{}\n' >"$DAEMON_JSON"
    fi

    log "starting dockerd (data root $DATA_ROOT, socket $SOCKET, log $LOG_FILE)"
    printf '\n==== %s engine.sh start\n' "$(date -Is)" >>"$LOG_FILE"
    # setsid: own session, so the daemon outlives the calling shell/job and is not hit by its signals.
    setsid dockerd \
        --config-file "$DAEMON_JSON" \
        --data-root "$DATA_ROOT" \
        --exec-root "$EXEC_ROOT" \
        --pidfile "$PID_FILE" \
        --host "$OUR_HOST" \
        --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
        --cgroup-parent "/$CGROUP_PARENT" \
        </dev/null >>"$LOG_FILE" 2>&1 8>&- &
    local launched=$! pid="" t0=$SECONDS
    # Record the launched PID at once, so `stop` can end it even if we are interrupted while waiting.
    write_state 1 "$launched" "$OUR_HOST"

    while ((SECONDS - t0 < START_TIMEOUT)); do
        pid=$(cat "$PID_FILE" 2>/dev/null || true)
        [[ -n $pid ]] || pid=$launched
        if ! alive "$pid" && ! alive "$launched"; then
            log "dockerd exited during start; last lines of $LOG_FILE:"
            tail -n 40 "$LOG_FILE" >&2
            rm -f "$STATE_FILE"
            exit 1
        fi
        if docker_answers "$OUR_HOST"; then
            write_state 1 "$pid" "$OUR_HOST"
            log "dockerd (pid $pid) answers after $((SECONDS - t0))s: $(DOCKER_HOST=$OUR_HOST docker version --format 'server {{.Server.Version}} API {{.Server.APIVersion}}, client {{.Client.Version}} API {{.Client.APIVersion}}' 2>/dev/null || true)"
            print_env "$OUR_HOST" started "$pid"
            return 0
        fi
        sleep 0.5
    done
    log "dockerd did not answer within ${START_TIMEOUT}s; last lines of $LOG_FILE:"
    tail -n 40 "$LOG_FILE" >&2
    cmd_stop >/dev/null 2>&1 || true
    exit 1
}

cmd_stop() {
    if ((!CACHE_WRITABLE)); then
        log "cannot write $CACHE: whatever runs from it was not started by this user; nothing stopped"
        return 0
    fi
    if ! read_state; then
        log "no engine state in $CACHE: nothing to stop"
        return 0
    fi
    if [[ $STATE_OWNED != 1 ]]; then
        log "the engine at $STATE_HOST was not started by this script: leaving it running"
        rm -f "$STATE_FILE"
        return 0
    fi
    local pid=$STATE_PID
    local from_pidfile
    from_pidfile=$(cat "$PID_FILE" 2>/dev/null || true)
    if ! is_our_dockerd "$pid" && is_our_dockerd "$from_pidfile"; then pid=$from_pidfile; fi
    # Note containerd and shims now, while dockerd still runs (the shims outlive a killed dockerd).
    local extra=()
    mapfile -t extra < <(our_containerd_pids)
    if is_our_dockerd "$pid"; then
        log "stopping our dockerd (pid $pid): SIGTERM, SIGKILL after ${STOP_TIMEOUT}s"
        term_then_kill "$STOP_TIMEOUT" "$pid"
    else
        log "our dockerd (pid ${pid:-?}) is not running"
    fi
    # dockerd ends its containerd on a clean shutdown; after a SIGKILL (or a crash) it does not.
    local left=() p
    mapfile -t extra < <({ printf '%s\n' "${extra[@]}"; our_containerd_pids; } | sort -un | sed '/^$/d')
    for p in "${extra[@]}"; do alive "$p" && left+=("$p"); done
    if ((${#left[@]})); then
        log "ending leftover containerd/shim processes of ours: ${left[*]}"
        term_then_kill 10 "${left[@]}"
    fi
    # Container processes outlive their shim if the daemon died without stopping them.
    left=()
    mapfile -t left < <(our_container_pids)
    if ((${#left[@]})); then
        log "ending leftover container processes of ours: ${left[*]}"
        term_then_kill 10 "${left[@]}"
    fi
    unmount_ours
    rm -f "$PID_FILE" "$SOCKET" "$STATE_FILE"
    log "stopped"
}

cmd_env() {
    if read_state; then
        if [[ $STATE_OWNED == 1 ]] && is_our_dockerd "$STATE_PID" && docker_answers "$OUR_HOST"; then
            print_env "$OUR_HOST"; return 0
        fi
        if [[ $STATE_OWNED == 0 ]] && docker_answers "$STATE_HOST"; then
            print_env "$STATE_HOST"; return 0
        fi
    fi
    if docker_answers "${DOCKER_HOST:-}"; then
        print_env "${DOCKER_HOST:-$(default_host)}"; return 0
    fi
    die 1 "no Docker engine answers: run '$0 start'"
}

cmd_status() {
    if read_state; then
        if [[ $STATE_OWNED == 1 ]]; then
            if is_our_dockerd "$STATE_PID" && docker_answers "$OUR_HOST"; then
                echo "ours: dockerd pid $STATE_PID at $OUR_HOST"; return 0
            fi
            echo "ours: recorded (pid $STATE_PID) but not answering"; return 1
        fi
        if docker_answers "$STATE_HOST"; then echo "existing: $STATE_HOST (not started by us)"; return 0; fi
    fi
    if docker_answers "${DOCKER_HOST:-}"; then echo "existing: ${DOCKER_HOST:-$(default_host)} (not recorded)"; return 0; fi
    echo "none"; return 1
}

case ${1:-} in
    start) lock; cmd_start ;;
    stop) if [[ -d $CACHE ]]; then lock; fi; cmd_stop ;;
    env) cmd_env ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|stop|env|status" >&2; exit 2 ;;
esac
