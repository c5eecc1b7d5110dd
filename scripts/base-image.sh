#!/usr/bin/env bash
# base-image.sh NAME: build a local Python base image without pulling from any registry.
#
# If an image NAME already exists in the engine, it is reused. Otherwise:
#   1. mmdebstrap (Debian's package, installed if missing) builds a Debian bookworm root file
#      system from this machine's own Debian apt sources (--variant=apt plus python3,
#      python3-venv, python3-pip, python-is-python3, ca-certificates, passwd (useradd/groupadd),
#      libgomp1 (Paddle's CPU wheel), netbase, tzdata), with docs/man pages/locales left out
#      like Debian's slim images;
#   2. `docker import` turns it into an image;
#   3. a small `docker build` on top copies this machine's CA bundle into the image, points
#      PIP_CERT / REQUESTS_CA_BUNDLE / SSL_CERT_FILE at it, and copies the network part of the
#      host's pip configuration (index-url, extra-index-url, trusted-host, timeout, retries,
#      proxy; local file:// indexes and paths are left out: they do not exist in the image), so
#      that `pip install` inside `docker build --network host` reaches the same package index
#      as the host. The result is tagged NAME.
# The image is meant to stand in for python:3.11-slim-bookworm as a Dockerfile's base
# (`--build-arg PYTHON_IMAGE=NAME`): `python -m venv`, `pip install`, `useradd`, `groupadd` and
# `apt-get update && apt-get install` work in it. Python is Debian's 3.11.
#
# Usage: base-image.sh [--rebuild] NAME      build (or reuse) NAME
#        base-image.sh --print-pip-conf      print the pip.conf that would go into the image
# Environment:
#   ELASTIC_CTR_CACHE          cache directory (default: <repo>/.cache/containers)
#   ELASTIC_CTR_BASE_PACKAGES  extra Debian packages for the root file system (comma separated)
#   DOCKER_HOST                the engine; if unset and no daemon answers, `engine.sh env` is asked
# Exit codes: 0 ok; 1 failure; 2 usage; 3 cannot install mmdebstrap (not root / not Debian).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
if [[ -z ${ELASTIC_CTR_CACHE:-} ]]; then
    ELASTIC_CTR_CACHE=$(cd -- "$SCRIPT_DIR/.." && pwd)/.cache/containers   # scripts/ is at the repository root
fi
export ELASTIC_CTR_CACHE
CACHE=$ELASTIC_CTR_CACHE
SUITE=bookworm
HOST_CA=/etc/ssl/certs/ca-certificates.crt
IMAGE_CA=/usr/local/share/elastic-ctr/ca-certificates.crt   # no Debian package rewrites this path
PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,passwd,libgomp1,netbase,tzdata
[[ -n ${ELASTIC_CTR_BASE_PACKAGES:-} ]] && PACKAGES+=",$ELASTIC_CTR_BASE_PACKAGES"

stamp() { local l; while IFS= read -r l; do printf '%(%T)T %s\n' -1 "$l"; done; }
log() { printf 'base-image.sh: %s\n' "$*" >&2; }
die() { local code=$1; shift; log "error: $*"; exit "$code"; }

# The network part of the host's effective pip configuration, as a pip.conf (empty: nothing to copy).
# Sources in pip's order (later wins): /etc/xdg/pip/pip.conf, /etc/pip.conf, ~/.pip/pip.conf,
# ~/.config/pip/pip.conf, $PIP_CONFIG_FILE, then PIP_* environment variables.
pip_conf() {
    local py
    py=$(command -v python3 || command -v python || true)
    if [[ -z $py ]]; then
        log "warning: no python on the host to read its pip configuration: none copied"
        return 0
    fi
    "$py" - "$IMAGE_CA" <<'PY'
import configparser, os, sys, urllib.parse

image_ca = sys.argv[1]
keys = ["index-url", "extra-index-url", "find-links", "trusted-host", "timeout", "retries", "proxy"]
aliases = {"default-timeout": "timeout"}
url_keys = {"index-url", "extra-index-url", "find-links"}

def warn(msg):
    print("base-image.sh: warning: " + msg, file=sys.stderr)

files = []
cfg_env = os.environ.get("PIP_CONFIG_FILE")
if cfg_env != os.devnull:
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files += [os.path.join(d, "pip", "pip.conf") for d in xdg_dirs if d]
    files.append("/etc/pip.conf")
    home = os.path.expanduser("~")
    files.append(os.path.join(home, ".pip", "pip.conf"))
    files.append(os.path.join(os.environ.get("XDG_CONFIG_HOME", os.path.join(home, ".config")), "pip", "pip.conf"))
    if cfg_env:
        files.append(cfg_env)

values, origin = {}, {}
for path in files:
    if not os.path.isfile(path):
        continue
    cp = configparser.RawConfigParser()
    try:
        cp.read(path)
    except configparser.Error as e:
        warn(f"cannot parse {path}: {e}")
        continue
    for section in ("global", "install", "download"):
        if not cp.has_section(section):
            continue
        for k, v in cp.items(section):
            k = aliases.get(k, k)
            if k in keys:
                values[k] = v
                origin[k] = f"{path} [{section}]"
            elif k in ("constraint", "requirement", "client-cert", "build", "src", "target", "root", "prefix"):
                warn(f"{path} [{section}] {k} = {v}: a host path, not copied into the image")
for k in keys + list(aliases):
    env = "PIP_" + k.upper().replace("-", "_")
    if env in os.environ:
        values[aliases.get(k, k)] = os.environ[env]
        origin[aliases.get(k, k)] = f"${env}"
for env in ("PIP_CONSTRAINT", "PIP_REQUIREMENT"):
    if os.environ.get(env):
        warn(f"${env} = {os.environ[env]}: a host path, not copied into the image")

out = {}
for k, v in values.items():
    if k in url_keys:
        kept = []
        for tok in v.split():
            scheme = urllib.parse.urlsplit(tok).scheme.lower()
            if scheme in ("http", "https"):
                if urllib.parse.urlsplit(tok).password or "@" in urllib.parse.urlsplit(tok).netloc:
                    warn(f"{k} from {origin[k]} carries credentials: they will be baked into the image")
                kept.append(tok)
            else:
                warn(f"{k} {tok} (from {origin[k]}) is local to the host: not copied into the image")
        if kept:
            out[k] = kept
    else:
        out[k] = v.split() if k == "trusted-host" else v
if not any(k in out for k in ("index-url", "extra-index-url", "find-links")):
    sys.exit(0)   # nothing but the defaults: pip in the image uses its default index
print("# Written by base-image.sh from the network part of the build host's pip configuration.")
print("[global]")
print(f"cert = {image_ca}")
for k in keys:
    if k in out:
        v = out[k]
        if isinstance(v, list):
            v = ("\n    " + "\n    ".join(v)) if len(v) > 1 else v[0]
        print(f"{k} = {v}")
PY
}

# One-line apt sources for this host's Debian archives (origin Debian, suites bookworm*), from
# `apt-cache policy`, so the image uses the same mirror(s) as the host.
debian_sources() {
    apt-cache policy 2>/dev/null | awk -v suite="$SUITE" '
        $1 ~ /^[0-9]+$/ && $NF == "Packages" && NF == 5 { uri = $2; n = split($3, sc, "/"); s = sc[1]; c = (n > 1 ? sc[2] : ""); next }
        $1 == "release" && uri != "" {
            if ($2 ~ /(^|,)o=Debian(,|$)/ && c != "" && (s == suite || index(s, suite "-") == 1)) {
                key = uri " " s
                if (!(key in comps)) { order[++m] = key; comps[key] = c }
                else if (index(" " comps[key] " ", " " c " ") == 0) comps[key] = comps[key] " " c
            }
            uri = ""
        }
        END { for (i = 1; i <= m; i++) print "deb " order[i] " " comps[order[i]] }'
}

# apt options of the host that the root file system's apt needs too (proxies, release validity).
host_aptopts() {
    apt-config dump 2>/dev/null | grep -E '^Acquire::((https?|ftp)::Proxy|Check-Valid-Until|Check-Date)' || true
}

ensure_engine() {
    if ! timeout 15 docker info >/dev/null 2>&1; then
        local envline
        envline=$("$SCRIPT_DIR/engine.sh" env 2>/dev/null) || die 1 "no Docker engine answers: run '$SCRIPT_DIR/engine.sh start' first"
        eval "$envline"
    fi
}

ensure_mmdebstrap() {
    command -v mmdebstrap >/dev/null 2>&1 && return 0
    [[ $(id -u) -eq 0 ]] || die 3 "mmdebstrap is missing and only root can install it (apt-get install mmdebstrap)"
    if [[ ! -f /etc/debian_version ]] || ! command -v apt-get >/dev/null 2>&1; then
        die 3 "mmdebstrap is missing and this is not a Debian system"
    fi
    log "installing Debian's mmdebstrap (apt-get)"
    mkdir -p "$CACHE"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap ||
           { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap; }; } >"$CACHE/apt-mmdebstrap.log" 2>&1; then
        tail -n 20 "$CACHE/apt-mmdebstrap.log" >&2
        die 1 "apt-get install mmdebstrap failed (log: $CACHE/apt-mmdebstrap.log)"
    fi
}

build() {
    local name=$1 rebuild=$2
    ensure_engine
    if ((!rebuild)) && docker image inspect "$name" >/dev/null 2>&1; then
        log "image $name already exists: reusing it ($(docker image inspect --format '{{.Id}}' "$name"))"
        echo "$name"
        return 0
    fi
    [[ -r $HOST_CA ]] || die 1 "no CA bundle at $HOST_CA on the host"
    [[ $(id -u) -eq 0 ]] || die 3 "mmdebstrap --mode=root needs root (uid $(id -u))"
    ensure_mmdebstrap

    local work=$CACHE/base-build
    mkdir -p "$work"
    # One build at a time per cache directory.
    exec 9>"$CACHE/base-image.lock"
    flock 9
    if ((!rebuild)) && docker image inspect "$name" >/dev/null 2>&1; then
        log "image $name was built meanwhile: reusing it"; echo "$name"; return 0
    fi
    rm -rf "$work/context" "$work/rootfs.tar"
    mkdir -p "$work/context"

    local sources
    sources=$(debian_sources)
    if [[ -z $sources ]]; then
        log "no Debian $SUITE sources found in apt-cache policy; running apt-get update"
        apt-get update -qq >&2 || true
        sources=$(debian_sources)
    fi
    local mirror_args=()
    if [[ -n $sources ]]; then
        log "Debian sources for the root file system:"$'\n'"$sources"
        while IFS= read -r line; do mirror_args+=("$line"); done <<<"$sources"
    else
        log "warning: no Debian sources found on the host: using mmdebstrap's default mirror"
    fi
    local aptopts=() opt
    while IFS= read -r opt; do [[ -n $opt ]] && aptopts+=(--aptopt "$opt"); done < <(host_aptopts)

    local t0=$SECONDS
    log "mmdebstrap $SUITE (variant apt; packages $PACKAGES) -> $work/rootfs.tar (log: $work/mmdebstrap.log)"
    # shellcheck disable=SC2016  # the hooks' "$1" is expanded by mmdebstrap's shell, not here
    if ! mmdebstrap --mode=root --variant=apt --format=tar \
        --include="$PACKAGES" \
        "${aptopts[@]}" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/lintian/*' \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        --customize-hook='rm -rf "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* "$1"/var/log/*.log "$1"/var/log/apt/*' \
        "$SUITE" "$work/rootfs.tar" "${mirror_args[@]}" 2>&1 | stamp >"$work/mmdebstrap.log"; then
        tail -n 30 "$work/mmdebstrap.log" >&2
        die 1 "mmdebstrap failed (log: $work/mmdebstrap.log)"
    fi
    log "root file system: $(du -h "$work/rootfs.tar" | cut -f1) in $((SECONDS - t0))s"

    local rootfs_id
    rootfs_id=$(docker import \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        --message "elastic-ctr base root file system (mmdebstrap $SUITE)" \
        "$work/rootfs.tar")
    rm -f "$work/rootfs.tar"
    log "imported root file system as $rootfs_id"

    cp "$HOST_CA" "$work/context/ca-certificates.crt"
    local conf copy_conf=""
    conf=$(pip_conf)
    if [[ -n $conf ]]; then
        printf '%s\n' "$conf" >"$work/context/pip.conf"
        copy_conf="COPY pip.conf /etc/pip.conf"
        log "copying the host's pip index settings into /etc/pip.conf:"$'\n'"$conf"
    else
        log "the host's pip configuration names no network index: pip in the image uses its default index"
    fi
    cat >"$work/context/Dockerfile" <<EOF
FROM $rootfs_id
# The build host's CA bundle (it may hold a CA that the host's HTTPS traffic depends on):
# at a path no package rewrites, and as the system bundle (update-ca-certificates replaces that one).
COPY ca-certificates.crt $IMAGE_CA
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
$copy_conf
ENV LANG=C.UTF-8 \\
    PIP_CERT=$IMAGE_CA \\
    REQUESTS_CA_BUNDLE=$IMAGE_CA \\
    SSL_CERT_FILE=$IMAGE_CA
# What Dockerfiles written for python:3.11-slim-bookworm use must be here.
RUN set -e; for c in python python3 useradd groupadd apt-get; do command -v \$c >/dev/null; done; \\
    python -c 'import ensurepip, venv, ssl, sqlite3, zlib, ctypes'; python -m pip --version >/dev/null
LABEL org.elastic-ctr.base="mmdebstrap $SUITE" org.elastic-ctr.python="Debian python3"
CMD ["python3"]
EOF
    log "docker build -t $name (CA bundle, pip settings)"
    DOCKER_BUILDKIT=0 docker build --network host -q -t "$name" "$work/context" >&2 ||
        die 1 "docker build of $name failed"
    log "built $name: $(docker image inspect --format '{{.Id}} {{.Size}}' "$name" | awk '{printf "%s, %.0f MB", $1, $2/1e6}'), $((SECONDS - t0))s in all"
    echo "$name"
}

rebuild=0
case ${1:-} in
    --print-pip-conf) pip_conf; exit 0 ;;
    --rebuild) rebuild=1; shift ;;
    -h|--help|"") echo "usage: $0 [--rebuild] NAME | --print-pip-conf" >&2; exit 2 ;;
esac
[[ $# -eq 1 && -n $1 && $1 != -* ]] || { echo "usage: $0 [--rebuild] NAME | --print-pip-conf" >&2; exit 2; }
build "$1" "$rebuild"
