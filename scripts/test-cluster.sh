#!/usr/bin/env bash
# Real etcd + real kube-apiserver on loopback for the actix-coordination test suite.
#
# Usage:
#   scripts/test-cluster.sh install            install packages, build + cache kube-apiserver v1.20.2
#                                              and the client-go program tests/clientgo/leaderelect,
#                                              twice: with client-go 1.20.2 and with a newer one
#   scripts/test-cluster.sh up     [DIR]       (re)start a cluster in DIR, write DIR/env
#   scripts/test-cluster.sh down   [DIR]       stop everything started in DIR (idempotent)
#   scripts/test-cluster.sh status [DIR]       show what runs in DIR
#   scripts/test-cluster.sh run [DIR] -- CMD.. install, up, run CMD with DIR/env sourced, always down;
#                                              exits with CMD's status
# DIR defaults to <repo>/target/test-cluster. It must not contain whitespace.
#
# `up` starts six processes, all on 127.0.0.1 with ports chosen outside the kernel's ephemeral
# range (so outgoing connections cannot steal them), from 10000 to 19999 (the tests' own servers
# take theirs from 20000 up):
#   - etcd "kube"   (DIR/etcd, DIR/etcd.log, DIR/etcd.pid): storage of the apiserver;
#   - kube-apiserver (DIR/apiserver.log, DIR/apiserver.pid): TLS (self-signed, DIR/certs/apiserver.crt),
#     static bearer tokens (DIR/tokens.csv), RBAC; namespace actix-coordination-test with the Role of
#     deploy/rbac.yaml bound to user `lease-holder`;
#   - etcd "lease"  (DIR/etcd-lease, DIR/etcd-lease.log, DIR/etcd-lease.pid): for the etcd backend tests;
#   - a three-member etcd cluster "etcd3" for the cluster tests (tests/etcd_cluster.rs): members n1, n2,
#     n3, each with its own client and peer port; member nK has its data dir DIR/etcd3/nK, its log
#     DIR/etcd3/nK.log (appended to by restarts), its CURRENT pid in DIR/etcd3/nK.pid and a restart
#     script DIR/etcd3/nK.sh. Tests kill (SIGKILL), stop (SIGSTOP) and continue members; `DIR/etcd3/nK.sh`
#     starts a killed member again with the same data dir and flags, detached (its own session),
#     writes its new pid to DIR/etcd3/nK.pid and returns at once (it refuses to start a member that
#     still runs, or any member after `down`). `up` returns once the cluster has a leader.
# and writes DIR/env, shell-sourceable `export` lines:
#   ACTIX_COORD_TEST_K8S_URL              https://127.0.0.1:PORT of the apiserver
#   ACTIX_COORD_TEST_K8S_CA               DIR/certs/apiserver.crt (serving cert + its CA; trust it as CA)
#   ACTIX_COORD_TEST_K8S_TOKEN            bearer token of user `lease-holder` (only the shipped Role)
#   ACTIX_COORD_TEST_K8S_ADMIN_TOKEN      bearer token of user `admin` (group system:masters)
#   ACTIX_COORD_TEST_K8S_NOROLE_TOKEN     bearer token of user `no-role` (no Role: 403 on leases)
#   ACTIX_COORD_TEST_K8S_NAMESPACE        actix-coordination-test
#   ACTIX_COORD_TEST_KUBE_APISERVER_BIN   the cached kube-apiserver binary
#   ACTIX_COORD_TEST_CLIENTGO_BIN         the cached client-go leader election program built from
#                                         tests/clientgo/leaderelect/main.go (LeaseLock; see its
#                                         header for flags and the events it prints), client-go
#                                         v1.20.2 (judges a Lease expired by its OWN LeaseDuration)
#   ACTIX_COORD_TEST_CLIENTGO_NEW_BIN     the same program built with a newer client-go, v0.32.3
#                                         (Kubernetes 1.32; >= 1.27 judges a Lease expired by the
#                                         record's spec.leaseDurationSeconds, kubernetes PR 114872)
#   ACTIX_COORD_TEST_KUBE_APISERVER_ARGS  every flag of the running apiserver EXCEPT --secure-port,
#                                         whitespace-separated `--flag=value` words (no quoting needed).
#                                         Start another apiserver sharing the same etcd, certificate,
#                                         tokens and SA keys with:
#                                           $BIN $ARGS --secure-port=<free port>
#                                         (it reuses DIR/certs/apiserver.crt, so the same CA works).
#   ACTIX_COORD_TEST_KUBE_APISERVER_PID   pid of the apiserver started by `up`
#   ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT   http://127.0.0.1:P, the apiserver's etcd
#   ACTIX_COORD_TEST_KUBE_ETCD_PID        its pid
#   ACTIX_COORD_TEST_ETCD_ENDPOINT        http://127.0.0.1:P, the etcd for the etcd lease backend tests
#   ACTIX_COORD_TEST_ETCD_PID             its pid
#   ACTIX_COORD_TEST_ETCD_BIN             /usr/bin/etcd (to start private etcd instances in tests)
#   ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS  http://127.0.0.1:P1,http://127.0.0.1:P2,http://127.0.0.1:P3:
#                                         the client URLs of members n1, n2, n3 (in that order)
#   ACTIX_COORD_TEST_ETCD_CLUSTER_DIR     DIR/etcd3: nK.pid (current pid), nK.sh (restart), nK.log, nK/
#   ACTIX_COORD_TEST_DIR                  DIR (absolute)
# `down` also stops any leftover process whose arguments contain --cert-dir=DIR/certs (apiservers a
# test started from ACTIX_COORD_TEST_KUBE_APISERVER_ARGS) or --data-dir=DIR/etcd[-lease] or
# --data-dir=DIR/etcd3/nK (cluster members, also ones a test restarted: their pid files name them).
set -euo pipefail

KUBE_VERSION=1.20.2
# Debian bookworm's source package `kubernetes` 1.20.5+really1.20.2-* (e.g. -1.1+deb12u1): Kubernetes
# v1.20.2 with all Go dependencies vendored. Any Debian revision will do: only the .orig tarball is used.
KUBE_DEB_SRC_MATCH=really$KUBE_VERSION-
KUBE_SUITE=bookworm
NAMESPACE=actix-coordination-test
TEST_ROLE=actix-coordination-lease
READY_TIMEOUT=${ACTIX_COORD_TEST_READY_TIMEOUT:-60}
STOP_TIMEOUT=15

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/actix-coordination
KUBE_APISERVER_BIN=$CACHE_DIR/kube-apiserver-$KUBE_VERSION
ETCD_BIN=/usr/bin/etcd
ETCDCTL_BIN=/usr/bin/etcdctl
# The members of the three-member test cluster (DIR/etcd3/<name>...).
ETCD3_MEMBERS=(n1 n2 n3)
RBAC_YAML=$REPO_ROOT/deploy/rbac.yaml
# The client-go leader election program of the interop tests (tests/clientgo.rs), built by `install`
# from the same Kubernetes source as kube-apiserver and cached by version and source hash.
CLIENTGO_SRC=$REPO_ROOT/tests/clientgo/leaderelect/main.go
# The same program built with a newer client-go (>= 1.27: a Lease expires by the record's
# leaseDurationSeconds, not by the candidate's own LeaseDuration). Debian bookworm has no newer
# client-go and this machine reaches no Go module proxy, so `install` takes Go source packages of
# Debian releases: trixie's golang-k8s-client-go-dev $CLIENTGO_NEW_VERSION-* and the golang-*-dev
# packages it depends on (Arch: all, sources under /usr/share/gocode), and Go $GO_NEW_VERSION (client-go
# 0.32 needs Go >= 1.23) from bookworm-backports. They are downloaded with apt through a private apt
# configuration (the system's sources are left alone: no trixie package is ever installed), unpacked
# with `dpkg -x` into a temporary directory and built in GOPATH mode; only the binary is kept,
# cached by both versions and the source hash.
CLIENTGO_NEW_VERSION=0.32.3
CLIENTGO_NEW_SUITE=trixie
GO_NEW_VERSION=1.23
GO_NEW_SUITE=bookworm-backports

# Packages needed to run the cluster and to build the crate (etcd-client needs protoc); the chaos
# harness needs iproute2 and nftables (its nodes run in network namespaces, partitions are nftables
# rules) and libfaketime (clock faults).
RUNTIME_PKGS=(etcd-server etcd-client protobuf-compiler libprotobuf-dev openssl curl ca-certificates python3 python3-yaml
    iproute2 nftables libfaketime)
# Packages needed only to build kube-apiserver from Debian's source.
BUILD_PKGS=(golang-go jq rsync golang-github-modern-go-reflect2-dev make tar gzip)

export DEBIAN_FRONTEND=noninteractive

# Global state for the traps: a DIR whose processes must be stopped when this script exits, and
# the pid of the command `run` runs.
CLEANUP_DIR=
CHILD_PID=
BUILD_WORK= # temporary build directory of kube-apiserver, removed on exit

log() { printf '[test-cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck disable=SC2317 # invoked by trap
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n $CLEANUP_DIR ]]; then
        stop_all "$CLEANUP_DIR" || true
    fi
    if [[ -n $BUILD_WORK ]]; then
        chmod -R u+w "$BUILD_WORK" 2>/dev/null || true
        rm -rf "$BUILD_WORK"
    fi
    exit "$rc"
}
# INT/TERM while `run` waits for its command: pass the signal on and keep waiting (the command
# decides how to stop; `down` follows when it has exited). Otherwise: exit (EXIT trap cleans up).
# shellcheck disable=SC2317 # invoked by trap
on_signal() {
    if [[ -n $CHILD_PID ]] && alive "$CHILD_PID"; then
        log "SIG$1: passing it on to the command (pid $CHILD_PID)"
        kill -s "$1" "$CHILD_PID" 2>/dev/null || true
        return 0
    fi
    exit "$2"
}
trap on_exit EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n env DEBIAN_FRONTEND=noninteractive "$@"
    else
        die "need root (or passwordless sudo) to run: $*"
    fi
}

# ---------------------------------------------------------------------------------------- install

APT_UPDATED=0
apt_update() {
    log "apt-get update"
    as_root apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null
    APT_UPDATED=1
}

pkg_installed() {
    [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null) == ii* ]]
}

apt_install_missing() {
    local missing=() p
    for p in "$@"; do
        pkg_installed "$p" || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $APT_UPDATED -eq 1 ]] || apt_update
    log "apt-get install ${missing[*]}"
    as_root apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}" \
        </dev/null >/dev/null
}

# apt_sources_py SUITE [mirror]: reads the apt sources (deb822 *.sources or one-line *.list). Without
# `mirror`: prints PRESENT if a `deb-src` entry for Debian SUITE main exists, else the path of a new
# sources file and its contents (a `deb-src` entry with the URI and keyring of the `deb` entry).
# With `mirror`: prints the Debian archive URI of the `deb` entry for SUITE main, then its keyring
# (Signed-By; empty line if none), the defaults if there is no such entry.
apt_sources_py() {
    python3 - "$@" <<'PY'
import glob, os, re, sys
suite = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "deb-src"
DEFAULT_URI = "http://deb.debian.org/debian"
DEFAULT_KEY = "/usr/share/keyrings/debian-archive-keyring.gpg"

def deb822(path):
    paras, cur, key = [], {}, None
    for raw in open(path, encoding="utf-8", errors="replace"):
        line = raw.rstrip("\n")
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                paras.append(cur)
            cur, key = {}, None
            continue
        if line[0] in " \t" and key:
            cur[key] += "\n" + line
            continue
        k, _, v = line.partition(":")
        key = k.strip().lower()
        cur[key] = v.strip()
    if cur:
        paras.append(cur)
    for p in paras:
        if p.get("enabled", "yes").strip().lower() == "no":
            continue
        yield dict(fmt="deb822", types=p.get("types", "").split(), uris=p.get("uris", "").split(),
                   suites=p.get("suites", "").split(), comps=p.get("components", "").split(),
                   signed_by=p.get("signed-by"), opts=None)

def oneline(path):
    for raw in open(path, encoding="utf-8", errors="replace"):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(deb|deb-src)\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = (m.group(2) or "").strip()
        sb = re.search(r"signed-by=(\S+)", opts)
        yield dict(fmt="oneline", types=[m.group(1)], uris=[m.group(3)], suites=[m.group(4)],
                   comps=m.group(5).split(), signed_by=sb.group(1).rstrip("]") if sb else None,
                   opts=opts)

entries = []
for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    entries += list(deb822(f))
for f in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    if os.path.exists(f):
        entries += list(oneline(f))

def debian_archive(e):
    return any(re.search(r"/debian/?$", u) for u in e["uris"]) and suite in e["suites"] \
        and "main" in e["comps"]

src = next((e for e in entries if "deb" in e["types"] and debian_archive(e)), None)
if src is None:
    src = dict(fmt="deb822", uris=[DEFAULT_URI],
               signed_by=DEFAULT_KEY if os.path.exists(DEFAULT_KEY) else None)
    print("no %s `deb` entry found; using %s" % (suite, DEFAULT_URI), file=sys.stderr)
uris = [u for u in src["uris"] if re.search(r"/debian/?$", u)]
if mode == "mirror":
    print(uris[0])
    print(src["signed_by"] or "")
    sys.exit(0)
for e in entries:
    if "deb-src" in e["types"] and debian_archive(e):
        print("PRESENT")
        sys.exit(0)
if src["fmt"] == "deb822":
    print("/etc/apt/sources.list.d/actix-coordination-deb-src.sources")
    print("# Added by actix-coordination scripts/test-cluster.sh (kube-apiserver source build).")
    print("Types: deb-src")
    print("URIs: " + " ".join(uris))
    print("Suites: " + suite)
    print("Components: main")
    if src["signed_by"]:
        print("Signed-By: " + src["signed_by"])
else:
    print("/etc/apt/sources.list.d/actix-coordination-deb-src.list")
    print("# Added by actix-coordination scripts/test-cluster.sh (kube-apiserver source build).")
    opts = (src["opts"] + " ") if src["opts"] else ""
    print("deb-src %s%s %s main" % (opts, uris[0], suite))
PY
}

# Add a `deb-src` entry for Debian bookworm main, with the URI and keyring of the existing `deb`
# entry (deb822 *.sources or one-line *.list, whichever is present). Returns 0 if it was already there.
ensure_deb_src() {
    local out target
    out=$(apt_sources_py "$KUBE_SUITE")
    if [[ $out == PRESENT ]]; then
        return 0
    fi
    [[ $out == /etc/apt/sources.list.d/*$'\n'* ]] || die "could not derive a deb-src entry: $out"
    target=${out%%$'\n'*}
    log "enabling source packages: $target"
    printf '%s\n' "${out#*$'\n'}" | as_root tee "$target" >/dev/null
    return 1
}

# Newest Debian version of the source package that is Kubernetes $KUBE_VERSION, or nothing.
kube_src_version() {
    apt-cache showsrc kubernetes 2>/dev/null | sed -n 's/^Version: //p' | grep -F "$KUBE_DEB_SRC_MATCH" |
        sort -V | tail -n 1 || true
}

apiserver_ok() {
    [[ -x $KUBE_APISERVER_BIN ]] && "$KUBE_APISERVER_BIN" --version >/dev/null 2>&1
}

# The client-go program's cache key: the Kubernetes version and a hash of its source, so that an
# edited program is rebuilt (binaries of other versions of the source stay: other checkouts use them).
clientgo_bin() {
    [[ -f $CLIENTGO_SRC ]] || die "$CLIENTGO_SRC missing"
    local hash
    hash=$(sha256sum "$CLIENTGO_SRC" | cut -c1-16)
    printf '%s/leaderelect-%s-%s' "$CACHE_DIR" "$KUBE_VERSION" "$hash"
}

clientgo_ok() {
    local bin
    bin=$(clientgo_bin)
    [[ -x $bin ]] && [[ -s $bin ]]
}

clientgo_new_bin() {
    [[ -f $CLIENTGO_SRC ]] || die "$CLIENTGO_SRC missing"
    local hash
    hash=$(sha256sum "$CLIENTGO_SRC" | cut -c1-16)
    printf '%s/leaderelect-clientgo%s-go%s-%s' "$CACHE_DIR" "$CLIENTGO_NEW_VERSION" "$GO_NEW_VERSION" "$hash"
}

clientgo_new_ok() {
    local bin
    bin=$(clientgo_new_bin)
    [[ -x $bin ]] && [[ -s $bin ]]
}

# build_clientgo_new: build the client-go program with client-go $CLIENTGO_NEW_VERSION (see
# CLIENTGO_NEW_VERSION above) and cache it at $(clientgo_new_bin). About 2-3 minutes on 2 cores.
build_clientgo_new() {
    local bin build_log work start=$SECONDS rc mirror
    bin=$(clientgo_new_bin)
    build_log=$CACHE_DIR/leaderelect-clientgo$CLIENTGO_NEW_VERSION.build.log
    # The Debian archive URI and keyring of the system's bookworm entry (a configured mirror is used).
    mirror=$(apt_sources_py "$KUBE_SUITE" mirror) || die "could not read the apt sources"
    work=$(mktemp -d "${TMPDIR:-/tmp}/actix-coordination-clientgo-build.XXXXXX")
    BUILD_WORK=$work
    log "building leaderelect with client-go $CLIENTGO_NEW_VERSION ($CLIENTGO_NEW_SUITE) and Go" \
        "$GO_NEW_VERSION ($GO_NEW_SUITE) in $work (about 2-3 minutes; log: $build_log)"
    set +e
    (
        set -euo pipefail
        cd "$work"
        uri=${mirror%%$'\n'*}
        keyring=${mirror#*$'\n'}
        [[ -n $keyring ]] || keyring=/usr/share/keyrings/debian-archive-keyring.gpg
        mkdir -p apt/lists/partial apt/cache/archives/partial apt/sources.list.d apt/preferences.d debs root
        touch apt/sources.list apt/status apt/preferences
        printf 'Types: deb\nURIs: %s\nSuites: %s %s\nComponents: main\nSigned-By: %s\n' \
            "$uri" "$CLIENTGO_NEW_SUITE" "$GO_NEW_SUITE" "$keyring" >apt/sources.list.d/private.sources
        arch=$(dpkg --print-architecture)
        # Everything apt reads or writes is under $work/apt; the status file is empty, so apt
        # resolves the full dependency closure without looking at what is installed.
        apt_opts=(-q -o "Dir::Etc::SourceList=$work/apt/sources.list"
            -o "Dir::Etc::SourceParts=$work/apt/sources.list.d"
            -o "Dir::Etc::Preferences=$work/apt/preferences"
            -o "Dir::Etc::PreferencesParts=$work/apt/preferences.d"
            -o "Dir::State::Lists=$work/apt/lists" -o "Dir::State::status=$work/apt/status"
            -o "Dir::Cache=$work/apt/cache" -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch"
            -o APT::Sandbox::User=root -o Acquire::Languages=none
            -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
            -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
            -o Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false
            -o Acquire::IndexTargets::deb::CNF::DefaultEnabled=false)
        echo "== private apt: $uri $CLIENTGO_NEW_SUITE $GO_NEW_SUITE (keyring $keyring)"
        apt-get "${apt_opts[@]}" update </dev/null
        cg_version=$(apt-cache "${apt_opts[@]}" show golang-k8s-client-go-dev | sed -n 's/^Version: //p' |
            grep -E "^$CLIENTGO_NEW_VERSION-" | sort -V | tail -n 1 || true)
        if [[ -z $cg_version ]]; then
            echo "no golang-k8s-client-go-dev $CLIENTGO_NEW_VERSION-* in $CLIENTGO_NEW_SUITE; there is:"
            apt-cache "${apt_opts[@]}" show golang-k8s-client-go-dev | sed -n 's/^Version: //p'
            echo "(update CLIENTGO_NEW_VERSION in $0)"
            exit 1
        fi
        # The Go source packages client-go needs (golang-*-dev, Arch: all): its dependency closure
        # from an empty system, without the toolchain and C libraries that closure also brings.
        mapfile -t pkgs < <(apt-get "${apt_opts[@]}" -s install --no-install-recommends \
            "golang-k8s-client-go-dev=$cg_version" </dev/null |
            sed -n 's/^Inst \(golang-[^ ]*-dev\) (\([^ ]*\) .*/\1=\2/p')
        [[ ${#pkgs[@]} -gt 10 ]] || { echo "dependency closure of client-go too small: ${pkgs[*]}"; exit 1; }
        pkgs+=("golang-$GO_NEW_VERSION-go/$GO_NEW_SUITE" "golang-$GO_NEW_VERSION-src/$GO_NEW_SUITE")
        echo "== apt-get download (${#pkgs[@]} packages): ${pkgs[*]}"
        (cd debs && apt-get "${apt_opts[@]}" download "${pkgs[@]}" </dev/null)
        echo "== dpkg -x"
        for deb in debs/*.deb; do dpkg -x "$deb" root; done
        rm -rf debs
        goroot=$work/root/usr/lib/go-$GO_NEW_VERSION
        gocode=$work/root/usr/share/gocode/src
        # The change this program is for (kubernetes PR 114872): expiry by the record's duration.
        grep -q 'le.observedTime.Add(time.Second \* time.Duration(oldLeaderElectionRecord.LeaseDurationSeconds))' \
            "$gocode/k8s.io/client-go/tools/leaderelection/leaderelection.go"
        mkdir -p gopath/src/leaderelect
        cp "$CLIENTGO_SRC" gopath/src/leaderelect/main.go
        export GOROOT=$goroot GOPATH=$work/gopath:$work/root/usr/share/gocode GO111MODULE=off \
            GOCACHE=$work/gocache GOTOOLCHAIN=local GOPROXY=off GOFLAGS='' CGO_ENABLED=0
        "$goroot/bin/go" version
        echo "== go build (GOPATH mode)"
        (cd gopath/src/leaderelect && "$goroot/bin/go" build -o "$work/leaderelect" .)
        usage=$("$work/leaderelect" -h 2>&1 || true)
        [[ $usage == *-lease-duration* ]]
        cp "$work/leaderelect" "$bin.tmp.$$"
        mv -f "$bin.tmp.$$" "$bin"
    ) >"$build_log" 2>&1
    rc=$?
    set -e
    chmod -R u+w "$work" 2>/dev/null || true
    rm -rf "$work"
    BUILD_WORK=
    if [[ $rc -ne 0 ]]; then
        log "build of leaderelect with client-go $CLIENTGO_NEW_VERSION FAILED (exit $rc) after" \
            "$((SECONDS - start)) s; last lines of $build_log:"
        tail -n 60 "$build_log" >&2
        exit 1
    fi
    log "built leaderelect with client-go $CLIENTGO_NEW_VERSION in $((SECONDS - start)) s"
}

# build_from_source WANT_APISERVER WANT_CLIENTGO (each 0 or 1): download Debian's source of
# Kubernetes $KUBE_VERSION once, unpack it and build kube-apiserver and/or the client-go program
# from it; cache the binaries in $CACHE_DIR and remove the unpacked tree.
build_from_source() {
    local want_apiserver=$1 want_clientgo=$2
    apt_install_missing "${BUILD_PKGS[@]}"
    if ! ensure_deb_src || [[ -z $(kube_src_version) ]]; then
        apt_update
    fi
    local src_version
    src_version=$(kube_src_version)
    [[ -n $src_version ]] || die "no source package kubernetes *$KUBE_DEB_SRC_MATCH* in apt (bookworm deb-src)"

    mkdir -p "$CACHE_DIR"
    local what=() build_log
    [[ $want_apiserver -eq 1 ]] && what+=(kube-apiserver)
    [[ $want_clientgo -eq 1 ]] && what+=(leaderelect)
    if [[ $want_apiserver -eq 1 ]]; then
        build_log=$CACHE_DIR/kube-apiserver-$KUBE_VERSION.build.log
    else
        build_log=$CACHE_DIR/leaderelect-$KUBE_VERSION.build.log
    fi
    local clientgo
    clientgo=$(clientgo_bin)
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/actix-coordination-kube-build.XXXXXX")
    BUILD_WORK=$work
    log "building ${what[*]} (Kubernetes v$KUBE_VERSION) from Debian source in $work" \
        "(about 4-6 minutes for kube-apiserver, 2-3 for the client-go program alone; log: $build_log)"
    local start=$SECONDS rc
    # Not `( ... ) || rc=$?`: errexit would be ignored inside the subshell.
    set +e
    (
        set -euo pipefail
        cd "$work"
        echo "== apt-get source --download-only kubernetes=$src_version"
        apt-get source -q --download-only "kubernetes=$src_version" </dev/null
        orig=$(ls kubernetes_*"really$KUBE_VERSION".orig.tar.*)
        echo "== unpack $orig"
        mkdir src
        tar -xf "$orig" -C src --strip-components=1
        rm -f "$orig"
        cd src
        test -f hack/lib/version.sh
        # The apiserver panics without it; client-go decodes with the same json-iterator/reflect2,
        # so the client-go program gets it too.
        echo "== reflect2: vendored v1.0.1 -> Debian's v1.0.2 (Go 1.19 compatibility)"
        rm -rf vendor/github.com/modern-go/reflect2
        cp -rL /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
        echo "== GOPATH layout"
        mkdir -p .go/src/k8s.io
        ln -s ../../.. .go/src/k8s.io/kubernetes
        if [[ $want_apiserver -eq 1 ]]; then
            echo "== make WHAT=cmd/kube-apiserver"
            # No .git needed: the tarball is a `git archive` and hack/lib/version.sh carries v1.20.2.
            env GOPATH="$PWD/.go" GO111MODULE=off CGO_ENABLED=0 GOCACHE="$work/gocache" \
                make WHAT=cmd/kube-apiserver
            bin=_output/local/bin/linux/$(go env GOARCH)/kube-apiserver
            version=$("$bin" --version)
            echo "$version"
            [[ $version == *"v$KUBE_VERSION" ]]
            cp "$bin" "$KUBE_APISERVER_BIN.tmp.$$"
            mv -f "$KUBE_APISERVER_BIN.tmp.$$" "$KUBE_APISERVER_BIN"
        fi
        if [[ $want_clientgo -eq 1 ]]; then
            echo "== client-go program: $CLIENTGO_SRC -> cmd/leaderelect"
            mkdir -p cmd/leaderelect
            cp "$CLIENTGO_SRC" cmd/leaderelect/main.go
            # GOPATH mode with the tree's vendored client-go (the same GOCACHE as the apiserver,
            # whose build already compiled most of it).
            env GOPATH="$PWD/.go" GO111MODULE=off CGO_ENABLED=0 GOCACHE="$work/gocache" \
                go build -o "$work/leaderelect" k8s.io/kubernetes/cmd/leaderelect
            usage=$("$work/leaderelect" -h 2>&1 || true)
            [[ $usage == *-lease-duration* ]]
            cp "$work/leaderelect" "$clientgo.tmp.$$"
            mv -f "$clientgo.tmp.$$" "$clientgo"
        fi
    ) >"$build_log" 2>&1
    rc=$?
    set -e
    chmod -R u+w "$work" 2>/dev/null || true # in case anything was unpacked read-only
    rm -rf "$work"
    BUILD_WORK=
    if [[ $rc -ne 0 ]]; then
        log "build of ${what[*]} FAILED (exit $rc) after $((SECONDS - start)) s; last lines of $build_log:"
        tail -n 60 "$build_log" >&2
        exit 1
    fi
    log "built ${what[*]} in $((SECONDS - start)) s"
}

cmd_install() {
    [[ $# -eq 0 ]] || die "usage: $0 install"
    apt_install_missing "${RUNTIME_PKGS[@]}"
    mkdir -p "$CACHE_DIR"
    if apiserver_ok && clientgo_ok && clientgo_new_ok; then
        log "kube-apiserver cached: $KUBE_APISERVER_BIN ($("$KUBE_APISERVER_BIN" --version 2>&1))"
        log "client-go program cached: $(clientgo_bin)"
        log "client-go $CLIENTGO_NEW_VERSION program cached: $(clientgo_new_bin)"
        return 0
    fi
    # Serialise concurrent builds (several checkouts / engineers on one machine).
    exec 8>"$CACHE_DIR/.build.lock"
    if ! flock -n 8; then
        log "another build from the Kubernetes source is running; waiting for it"
        flock 8
    fi
    local want_apiserver=0 want_clientgo=0
    apiserver_ok || want_apiserver=1
    clientgo_ok || want_clientgo=1
    if [[ $want_apiserver -eq 1 || $want_clientgo -eq 1 ]]; then
        build_from_source "$want_apiserver" "$want_clientgo"
    fi
    clientgo_new_ok || build_clientgo_new
    exec 8>&-
    log "kube-apiserver ready: $KUBE_APISERVER_BIN ($("$KUBE_APISERVER_BIN" --version 2>&1))"
    log "client-go program ready: $(clientgo_bin)"
    log "client-go $CLIENTGO_NEW_VERSION program ready: $(clientgo_new_bin)"
}

# ------------------------------------------------------------------------------------ processes

resolve_dir() {
    local dir=${1:-$REPO_ROOT/target/test-cluster}
    [[ $dir =~ [[:space:]] ]] && die "cluster directory must not contain whitespace: '$dir'"
    mkdir -p "$dir"
    (cd "$dir" && pwd)
}

# Holds an exclusive lock on DIR (fd 9) until this script exits: two `run`/`up`/`down` on the same
# DIR wait for each other instead of killing each other's clusters. Children never inherit fd 9.
LOCKED_DIR=
lock_dir() {
    [[ $LOCKED_DIR == "$1" ]] && return 0
    exec 9>"$1.lock"
    if ! flock -n 9; then
        log "waiting for another test-cluster command using $1"
        flock 9
    fi
    LOCKED_DIR=$1
}

# Running, non-zombie process?
alive() {
    local stat
    # Not `stat=$(<file)`: with the file gone (process reaped) bash aborts the whole script.
    [[ -n $1 ]] || return 1
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
    stat=${stat##*) }
    [[ -n $stat && ${stat:0:1} != Z ]]
}

# Pids of the processes of DIR: the ones of the pid files, and any other (e.g. a second apiserver a
# test started from ACTIX_COORD_TEST_KUBE_APISERVER_ARGS, or a cluster member a test restarted with
# DIR/etcd3/nK.sh), recognised by their arguments. A pid file alone is not trusted: after a reboot or
# a crash its pid may name a foreign process.
cluster_pids() {
    local dir=$1
    python3 - "$dir" "${ETCD3_MEMBERS[@]}" <<'PY'
import os, sys
d = sys.argv[1]
marks = {"--cert-dir=%s/certs" % d, "--data-dir=%s/etcd" % d, "--data-dir=%s/etcd-lease" % d}
marks.update("--data-dir=%s/etcd3/%s" % (d, m) for m in sys.argv[2:])
ours = set()
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        args = open("/proc/%s/cmdline" % p, "rb").read().decode(errors="replace").split("\0")
    except OSError:
        continue
    if marks.intersection(args):
        ours.add(int(p))
print(" ".join(str(p) for p in sorted(ours)))
PY
}

stop_all() {
    local dir=$1 round
    # First make the members' restart scripts refuse (a test binary that outlives `run`, e.g. after
    # a SIGTERM that reached only cargo, must not start members again), then stop what runs, and
    # look again: a restart script may have been past its check already.
    if [[ -d $dir/etcd3 ]]; then
        : >"$dir/etcd3/stopped"
    fi
    for round in 1 2 3; do
        stop_pids "$dir" || return 1
        [[ -z $(cluster_pids "$dir") ]] && break
        log "more processes of $dir appeared while stopping (round $round)"
    done
    rm -f "$dir/apiserver.pid" "$dir/etcd.pid" "$dir/etcd-lease.pid" "$dir"/etcd3/*.pid
}

stop_pids() {
    local dir=$1 pids=() p remaining deadline
    read -r -a pids <<<"$(cluster_pids "$dir")"
    if [[ ${#pids[@]} -gt 0 ]]; then
        log "stopping ${#pids[@]} process(es) of $dir: ${pids[*]}"
        # SIGCONT first: a test may have SIGSTOPped one; a stopped process ignores TERM until continued.
        kill -CONT "${pids[@]}" 2>/dev/null || true
        kill -TERM "${pids[@]}" 2>/dev/null || true
        deadline=$((SECONDS + STOP_TIMEOUT))
        while :; do
            remaining=()
            for p in "${pids[@]}"; do alive "$p" && remaining+=("$p"); done
            [[ ${#remaining[@]} -eq 0 ]] && break
            if ((SECONDS >= deadline)); then
                log "still running after ${STOP_TIMEOUT}s, SIGKILL: ${remaining[*]}"
                kill -KILL "${remaining[@]}" 2>/dev/null || true
                deadline=$((SECONDS + 10))
                while ((SECONDS < deadline)); do
                    remaining=()
                    for p in "${pids[@]}"; do alive "$p" && remaining+=("$p"); done
                    [[ ${#remaining[@]} -eq 0 ]] && break
                    sleep 0.1
                done
                [[ ${#remaining[@]} -eq 0 ]] || { log "could not kill: ${remaining[*]}"; return 1; }
                break
            fi
            sleep 0.1
        done
    fi
}

# N free TCP ports on 127.0.0.1, from 10000 to 19999 (below the ephemeral range) when possible.
free_ports() {
    python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
try:
    lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
except OSError:
    lo, hi = 32768, 60999
# 10000-19999: the tests' own servers take ports from 20000 up (tests/common/mod.rs,
# free_loopback_ports), so neither takes a port of the other while its server is down.
if lo - 10000 >= 1000:
    cands = list(range(10000, min(lo, 20000)))
elif 65535 - hi >= 1000:
    cands = list(range(hi + 1, 65536))
else:
    cands = []
random.shuffle(cands)
held, ports = [], []
for port in cands + [0] * n:
    if len(ports) == n:
        break
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    held.append(s)
    ports.append(s.getsockname()[1])
print(" ".join(map(str, ports)))
PY
}

# start NAME CMD... : background process, stdin /dev/null, output DIR/NAME.log, pid DIR/NAME.pid.
start_proc() {
    local dir=$1 name=$2
    shift 2
    "$@" </dev/null >"$dir/$name.log" 2>&1 9>&- 8>&- &
    echo $! >"$dir/$name.pid"
}

fail_with_log() {
    local file=$1
    shift
    log "error: $*"
    log "last lines of $file:"
    tail -n 40 "$file" >&2 || true
    exit 1
}

wait_etcd() {
    local dir=$1 name=$2 endpoint=$3 deadline=$((SECONDS + 30))
    while :; do
        alive "$(cat "$dir/$name.pid")" || fail_with_log "$dir/$name.log" "$name exited during startup"
        if curl -fsS --max-time 2 "$endpoint/health" 2>/dev/null | grep -q '"health":"true"'; then
            return 0
        fi
        ((SECONDS < deadline)) || fail_with_log "$dir/$name.log" "$name not healthy after 30 s"
        sleep 0.2
    done
}

start_etcd() {
    local dir=$1 name=$2 client_port=$3 peer_port=$4
    local client=http://127.0.0.1:$client_port peer=http://127.0.0.1:$peer_port
    start_proc "$dir" "$name" "$ETCD_BIN" --name="$name" --data-dir="$dir/$name" \
        --listen-client-urls="$client" --advertise-client-urls="$client" \
        --listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer" \
        --initial-cluster="$name=$peer" --initial-cluster-state=new
}

# write_member_script DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN: writes DIR/etcd3/NAME.sh,
# which starts member NAME of the three-member cluster: detached (a session of its own, stdin
# /dev/null, output appended to DIR/etcd3/NAME.log), its pid written to DIR/etcd3/NAME.pid before
# the script returns. `up` starts the members with it, and tests restart a member they killed with
# it: on an existing data dir etcd ignores the --initial-* flags and rejoins the cluster as itself.
# It refuses to start a member whose pid file names a live process of that member, and any member
# once `down` (or the cleanup of `run`/`up`) stopped the cluster (DIR/etcd3/stopped).
write_member_script() {
    local dir=$1 name=$2 client_port=$3 peer_port=$4 initial_cluster=$5 token=$6
    local d=$dir/etcd3 client=http://127.0.0.1:$client_port peer=http://127.0.0.1:$peer_port
    local cmd=("$ETCD_BIN" --name="$name" --data-dir="$d/$name"
        --listen-client-urls="$client" --advertise-client-urls="$client"
        --listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer"
        --initial-cluster="$initial_cluster" --initial-cluster-state=new
        --initial-cluster-token="$token")
    {
        echo '#!/usr/bin/env bash'
        echo "# Written by scripts/test-cluster.sh up: starts member $name of the three-member test etcd"
        echo "# cluster (client $client, peer $peer) on its data dir, detached; its pid goes to"
        echo "# $name.pid, its output is appended to $name.log (next to this script)."
        echo 'set -euo pipefail'
        printf 'name=%q\npidfile=%q\nlog=%q\nmark=%q\n' "$name" "$d/$name.pid" "$d/$name.log" \
            "--data-dir=$d/$name"
        printf 'cmd=('
        printf ' %q' "${cmd[@]}"
        printf ' )\n'
        printf 'stopped=%q\n' "$d/stopped"
        cat <<'SCRIPT'
if [[ -e $stopped ]]; then
    echo "the test cluster was stopped (scripts/test-cluster.sh down): not starting member $name" >&2
    exit 1
fi
if pid=$(cat "$pidfile" 2>/dev/null) && [[ -n $pid ]] &&
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$mark"; then
    echo "member $name still runs (pid $pid): kill it first" >&2
    exit 1
fi
rm -f "$pidfile"
cd /
# The inner shell writes its own pid, then becomes etcd: the pid file names etcd whether or not
# setsid had to fork.
# shellcheck disable=SC2016
setsid bash -c 'echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0" && exec "$@"' "$pidfile" "${cmd[@]}" \
    </dev/null >>"$log" 2>&1 &
for _ in $(seq 100); do
    [[ -s $pidfile ]] && exit 0
    sleep 0.05
done
echo "member $name did not start (no pid in $pidfile after 5 s)" >&2
exit 1
SCRIPT
    } >"$d/$name.sh"
    chmod +x "$d/$name.sh"
}

# start_cluster3 DIR C1 P1 C2 P2 C3 P3: the three members on client ports Ck and peer ports Pk,
# started in parallel (each start returns at once).
start_cluster3() {
    local dir=$1 i name initial=() token
    shift
    local ports=("$@")
    mkdir -p "$dir/etcd3"
    for i in "${!ETCD3_MEMBERS[@]}"; do
        initial+=("${ETCD3_MEMBERS[$i]}=http://127.0.0.1:${ports[$((2 * i + 1))]}")
    done
    # A token of its own per `up`: a member of an earlier cluster can never join this one.
    token=actix-coord-test-$(openssl rand -hex 6)
    for i in "${!ETCD3_MEMBERS[@]}"; do
        name=${ETCD3_MEMBERS[$i]}
        write_member_script "$dir" "$name" "${ports[$((2 * i))]}" "${ports[$((2 * i + 1))]}" \
            "$(IFS=,; echo "${initial[*]}")" "$token"
        "$dir/etcd3/$name.sh" 9>&- 8>&- || fail_with_log "$dir/etcd3/$name.log" "cluster member $name did not start"
    done
}

# wait_cluster3 DIR E1 E2 E3: every member healthy (etcd's /health is true only on a member that
# has a leader and answers a read through it), and all three name the same leader.
wait_cluster3() {
    local dir=$1 i name deadline=$((SECONDS + 30)) ids leaders
    shift
    local endpoints=("$@")
    for i in "${!ETCD3_MEMBERS[@]}"; do
        name=${ETCD3_MEMBERS[$i]}
        while :; do
            alive "$(cat "$dir/etcd3/$name.pid")" ||
                fail_with_log "$dir/etcd3/$name.log" "cluster member $name exited during startup"
            if curl -fsS --max-time 2 "${endpoints[$i]}/health" 2>/dev/null | grep -q '"health":"true"'; then
                break
            fi
            ((SECONDS < deadline)) || fail_with_log "$dir/etcd3/$name.log" "cluster member $name not healthy after 30 s"
            sleep 0.2
        done
    done
    while :; do
        # The leader id each member reports (decimal, one line per member that answered).
        ids=$(ETCDCTL_API=3 "$ETCDCTL_BIN" --endpoints="$(IFS=,; echo "${endpoints[*]}")" \
            --command-timeout=2s endpoint status -w fields 2>/dev/null | sed -n 's/^"Leader" : //p' || true)
        leaders=$(sort -u <<<"$ids")
        if [[ $(grep -c . <<<"$ids") -eq ${#endpoints[@]} && $leaders != *$'\n'* && $leaders != 0 ]]; then
            log "three-member etcd cluster has leader $(printf '%x' "$leaders")"
            return 0
        fi
        ((SECONDS < deadline)) || fail_with_log "$dir/etcd3/n1.log" "three-member etcd cluster without one leader after 30 s (leaders: ${ids//$'\n'/ })"
        sleep 0.2
    done
}

cmd_up() {
    [[ $# -le 1 ]] || die "usage: $0 up [DIR]"
    local dir
    dir=$(resolve_dir "${1:-}")
    lock_dir "$dir"
    up_locked "$dir"
}

up_locked() {
    local dir=$1 start=$SECONDS
    [[ -x $ETCD_BIN ]] || die "$ETCD_BIN missing: run '$0 install' first"
    [[ -x $ETCDCTL_BIN ]] || die "$ETCDCTL_BIN missing: run '$0 install' first"
    apiserver_ok || die "kube-apiserver not built: run '$0 install' first"
    clientgo_ok || die "client-go program not built (or $CLIENTGO_SRC changed): run '$0 install' first"
    clientgo_new_ok ||
        die "client-go $CLIENTGO_NEW_VERSION program not built (or $CLIENTGO_SRC changed): run '$0 install' first"
    command -v curl >/dev/null || die "curl missing: run '$0 install' first"
    local yaml_py
    yaml_py=$(yaml_python) || die "python3 with the yaml module missing: run '$0 install' first"

    # Anything still running from a previous `up` in this DIR goes first.
    stop_all "$dir"
    CLEANUP_DIR=$dir # until the cluster is fully up: any failure stops what was started
    rm -rf "$dir/etcd" "$dir/etcd-lease" "$dir/etcd3" "$dir/certs" "$dir/env" "$dir/tokens.csv" \
        "$dir/sa.key" "$dir/sa.pub" "$dir"/*.log
    mkdir -p "$dir/certs"

    # Credentials.
    local admin_token lh_token norole_token
    admin_token=$(openssl rand -hex 32)
    lh_token=$(openssl rand -hex 32)
    norole_token=$(openssl rand -hex 32)
    (
        umask 077
        printf '%s,admin,uid-admin,"system:masters"\n' "$admin_token"
        printf '%s,lease-holder,uid-lease-holder\n' "$lh_token"
        printf '%s,no-role,uid-no-role\n' "$norole_token"
    ) >"$dir/tokens.csv"
    chmod 600 "$dir/tokens.csv"
    openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
    openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null

    # Ports: kube etcd client/peer, lease etcd client/peer, apiserver, then client/peer of each
    # member of the three-member cluster.
    local ports=() nports=$((5 + 2 * ${#ETCD3_MEMBERS[@]}))
    read -r -a ports <<<"$(free_ports "$nports")"
    [[ ${#ports[@]} -eq $nports ]] || die "could not find free ports"
    local kube_etcd=http://127.0.0.1:${ports[0]} lease_etcd=http://127.0.0.1:${ports[2]}
    local api_port=${ports[4]}
    local url=https://127.0.0.1:$api_port
    local cluster_endpoints=() i
    for i in "${!ETCD3_MEMBERS[@]}"; do
        cluster_endpoints+=("http://127.0.0.1:${ports[$((5 + 2 * i))]}")
    done

    # All etcd processes start in parallel; then each is waited for.
    start_etcd "$dir" etcd "${ports[0]}" "${ports[1]}"
    start_etcd "$dir" etcd-lease "${ports[2]}" "${ports[3]}"
    start_cluster3 "$dir" "${ports[@]:5}"
    wait_etcd "$dir" etcd "$kube_etcd"
    wait_etcd "$dir" etcd-lease "$lease_etcd"
    wait_cluster3 "$dir" "${cluster_endpoints[@]}"

    local args=(
        --etcd-servers="$kube_etcd"
        --bind-address=127.0.0.1
        --advertise-address=127.0.0.1
        --cert-dir="$dir/certs"
        --token-auth-file="$dir/tokens.csv"
        --authorization-mode=RBAC
        --service-account-issuer=https://kubernetes.default.svc
        --service-account-key-file="$dir/sa.pub"
        --service-account-signing-key-file="$dir/sa.key"
        --service-cluster-ip-range=10.0.0.0/24
        --insecure-port=0
        --endpoint-reconciler-type=none
    )
    start_proc "$dir" apiserver "$KUBE_APISERVER_BIN" "${args[@]}" --secure-port="$api_port"

    local ca=$dir/certs/apiserver.crt out deadline=$((SECONDS + READY_TIMEOUT))
    while :; do
        alive "$(cat "$dir/apiserver.pid")" || fail_with_log "$dir/apiserver.log" "kube-apiserver exited during startup"
        if [[ -s $ca ]] && out=$(curl -sS --max-time 3 --cacert "$ca" -H "Authorization: Bearer $admin_token" \
            "$url/readyz" 2>/dev/null) && [[ $out == ok ]]; then
            break
        fi
        ((SECONDS < deadline)) || fail_with_log "$dir/apiserver.log" "kube-apiserver not ready after ${READY_TIMEOUT} s"
        sleep 0.5
    done

    apply_rbac "$yaml_py" "$url" "$ca" "$admin_token"

    local apiserver_pid kube_etcd_pid lease_etcd_pid
    apiserver_pid=$(cat "$dir/apiserver.pid")
    kube_etcd_pid=$(cat "$dir/etcd.pid")
    lease_etcd_pid=$(cat "$dir/etcd-lease.pid")
    {
        echo "# Written by scripts/test-cluster.sh up; source it: . $dir/env"
        echo "# Second apiserver on the same etcd: \$ACTIX_COORD_TEST_KUBE_APISERVER_BIN \$ACTIX_COORD_TEST_KUBE_APISERVER_ARGS --secure-port=PORT"
        env_line ACTIX_COORD_TEST_K8S_URL "$url"
        env_line ACTIX_COORD_TEST_K8S_CA "$ca"
        env_line ACTIX_COORD_TEST_K8S_TOKEN "$lh_token"
        env_line ACTIX_COORD_TEST_K8S_ADMIN_TOKEN "$admin_token"
        env_line ACTIX_COORD_TEST_K8S_NOROLE_TOKEN "$norole_token"
        env_line ACTIX_COORD_TEST_K8S_NAMESPACE "$NAMESPACE"
        env_line ACTIX_COORD_TEST_KUBE_APISERVER_BIN "$KUBE_APISERVER_BIN"
        env_line ACTIX_COORD_TEST_CLIENTGO_BIN "$(clientgo_bin)"
        env_line ACTIX_COORD_TEST_CLIENTGO_NEW_BIN "$(clientgo_new_bin)"
        env_line ACTIX_COORD_TEST_KUBE_APISERVER_ARGS "${args[*]}"
        env_line ACTIX_COORD_TEST_KUBE_APISERVER_PID "$apiserver_pid"
        env_line ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT "$kube_etcd"
        env_line ACTIX_COORD_TEST_KUBE_ETCD_PID "$kube_etcd_pid"
        env_line ACTIX_COORD_TEST_ETCD_ENDPOINT "$lease_etcd"
        env_line ACTIX_COORD_TEST_ETCD_PID "$lease_etcd_pid"
        env_line ACTIX_COORD_TEST_ETCD_BIN "$ETCD_BIN"
        env_line ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS "$(IFS=,; echo "${cluster_endpoints[*]}")"
        env_line ACTIX_COORD_TEST_ETCD_CLUSTER_DIR "$dir/etcd3"
        env_line ACTIX_COORD_TEST_DIR "$dir"
    } >"$dir/env.tmp"
    mv -f "$dir/env.tmp" "$dir/env"
    CLEANUP_DIR=
    log "cluster up in $((SECONDS - start)) s: apiserver $url (pid $apiserver_pid), etcd $kube_etcd," \
        "lease etcd $lease_etcd, three-member etcd $(IFS=,; echo "${cluster_endpoints[*]}"); env: $dir/env"
}

env_line() {
    # Values never contain single quotes (checked), so single-quoting is exact.
    [[ $2 != *"'"* ]] || die "unexpected quote in $1"
    printf "export %s='%s'\n" "$1" "$2"
}

# A python3 that has the yaml module (Debian's python3-yaml is for /usr/bin/python3; a pyenv
# python3 earlier in PATH does not see it).
yaml_python() {
    local py
    for py in /usr/bin/python3 python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import yaml' 2>/dev/null; then
            command -v "$py"
            return 0
        fi
    done
    return 1
}

# Create the test namespace, apply deploy/rbac.yaml (forced into the test namespace) and bind its
# Role to the test user `lease-holder`. The Role the tests run under is the shipped one, verbatim.
apply_rbac() {
    local py=$1 url=$2 ca=$3 token=$4
    [[ -f $RBAC_YAML ]] || die "$RBAC_YAML missing"
    "$py" - "$url" "$ca" "$token" "$NAMESPACE" "$RBAC_YAML" "$TEST_ROLE" <<'PY'
import json, ssl, sys, urllib.error, urllib.request
import yaml

url, ca, token, ns, path, test_role = sys.argv[1:7]
ctx = ssl.create_default_context(cafile=ca)

def create(api_path, body):
    req = urllib.request.Request(url + api_path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + token,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=20) as r:
            r.read()
    except urllib.error.HTTPError as e:
        sys.exit("POST %s failed: %s %s" % (api_path, e.code, e.read().decode(errors="replace")))
    where = body["metadata"]["name"]
    if body["kind"] != "Namespace":
        where = ns + "/" + where
    print("[test-cluster] created %s %s" % (body["kind"], where), file=sys.stderr)

RBAC = "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/" % ns
PATHS = {
    ("v1", "ServiceAccount"): "/api/v1/namespaces/%s/serviceaccounts" % ns,
    ("rbac.authorization.k8s.io/v1", "Role"): RBAC + "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): RBAC + "rolebindings",
}

create("/api/v1/namespaces",
       {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

docs = [d for d in yaml.safe_load_all(open(path)) if d]
roles = []
for d in docs:
    key = (d.get("apiVersion"), d.get("kind"))
    if key not in PATHS:
        sys.exit("%s: unsupported object %s" % (path, key))
    d["metadata"]["namespace"] = ns
    for s in d.get("subjects") or []:
        if s.get("kind") == "ServiceAccount":
            s["namespace"] = ns
    if d["kind"] == "Role":
        roles.append(d["metadata"]["name"])
    create(PATHS[key], d)
if test_role not in roles:
    sys.exit("%s defines no Role %r" % (path, test_role))

create(RBAC + "rolebindings", {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
    "metadata": {"name": test_role + "-test-user", "namespace": ns},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": test_role},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "lease-holder"}],
})
PY
}

cmd_down() {
    [[ $# -le 1 ]] || die "usage: $0 down [DIR]"
    local dir=${1:-$REPO_ROOT/target/test-cluster}
    [[ -d $dir ]] || { log "nothing in $dir"; return 0; }
    dir=$(resolve_dir "$dir")
    lock_dir "$dir"
    stop_all "$dir"
    rm -f "$dir/env"
    sweep_chaos_namespaces
    log "down: $dir"
}

# Removes the network namespaces (and subnet claims) of chaos runs whose test process no longer
# runs (tests/common/netns.rs names them actix-chaos-<pid>-<n>; a run removes its own).
sweep_chaos_namespaces() {
    command -v ip > /dev/null || return 0
    local ns pid link claim
    for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep '^actix-chaos-' || true); do
        pid=${ns#actix-chaos-}
        pid=${pid%%-*}
        if ! alive "$pid"; then
            for link in $(ip -n "$ns" -o link show 2> /dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
                [[ $link == lo ]] || ip -n "$ns" link del dev "$link" 2> /dev/null || true
            done
            ip netns del "$ns" 2> /dev/null || true
            rm -rf "/etc/netns/$ns"
            log "removed the network namespace $ns of a chaos run that no longer runs"
        fi
    done
    for claim in /run/actix-coordination-chaos/net-*; do
        [[ -e $claim ]] || continue
        pid=$(awk '{print $1; exit}' "$claim")
        if [[ -n $pid ]] && ! alive "$pid"; then
            rm -f "$claim"
        fi
    done
}

cmd_status() {
    [[ $# -le 1 ]] || die "usage: $0 status [DIR]"
    local dir=${1:-$REPO_ROOT/target/test-cluster} name pid running=0
    if [[ ! -d $dir ]]; then
        echo "no cluster directory $dir"
        return 1
    fi
    dir=$(cd "$dir" && pwd)
    echo "cluster directory: $dir"
    for name in etcd etcd-lease apiserver "${ETCD3_MEMBERS[@]/#/etcd3/}"; do
        pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
        if [[ -n $pid ]] && alive "$pid"; then
            if [[ $(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) == T ]]; then
                echo "  $name: STOPPED (SIGSTOP, pid $pid)"
            else
                echo "  $name: running (pid $pid)"
            fi
            running=$((running + 1))
        else
            echo "  $name: not running"
        fi
    done
    local others
    others=$(cluster_pids "$dir")
    echo "  processes of this directory: ${others:-none}"
    if [[ -f $dir/env ]]; then
        (
            # shellcheck disable=SC1091
            . "$dir/env"
            echo "  apiserver: $ACTIX_COORD_TEST_K8S_URL readyz=$(curl -sS --max-time 3 \
                --cacert "$ACTIX_COORD_TEST_K8S_CA" -H "Authorization: Bearer $ACTIX_COORD_TEST_K8S_ADMIN_TOKEN" \
                "$ACTIX_COORD_TEST_K8S_URL/readyz" 2>&1 || true)"
            echo "  kube etcd: $ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT health=$(curl -sS --max-time 3 \
                "$ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT/health" 2>&1 || true)"
            echo "  lease etcd: $ACTIX_COORD_TEST_ETCD_ENDPOINT health=$(curl -sS --max-time 3 \
                "$ACTIX_COORD_TEST_ETCD_ENDPOINT/health" 2>&1 || true)"
            local e
            for e in ${ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS//,/ }; do
                echo "  three-member etcd: $e health=$(curl -sS --max-time 3 "$e/health" 2>&1 || true)"
            done
            ETCDCTL_API=3 "$ETCDCTL_BIN" --endpoints="$ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS" \
                --command-timeout=2s endpoint status -w table 2>&1 | sed 's/^/  /' || true
            echo "  env: $dir/env"
        )
    fi
    [[ $running -eq $((3 + ${#ETCD3_MEMBERS[@]})) ]]
}

cmd_run() {
    local dir_arg=
    if [[ $# -gt 0 && $1 != -- ]]; then
        dir_arg=$1
        shift
    fi
    [[ ${1:-} == -- ]] || die "usage: $0 run [DIR] -- CMD..."
    shift
    [[ $# -gt 0 ]] || die "usage: $0 run [DIR] -- CMD..."
    cmd_install
    local dir
    dir=$(resolve_dir "$dir_arg")
    lock_dir "$dir"
    CLEANUP_DIR=$dir # always `down` on exit, whatever happens
    up_locked "$dir"
    CLEANUP_DIR=$dir
    # In the background + `wait`, so that a SIGTERM/SIGINT to this script is handled at once
    # (bash runs traps only after a foreground command ends).
    (
        trap - INT QUIT TERM
        # shellcheck disable=SC1091
        . "$dir/env"
        exec "$@"
    ) 9>&- &
    CHILD_PID=$!
    local rc=0
    wait "$CHILD_PID" || rc=$?
    while alive "$CHILD_PID"; do # `wait` was interrupted by a trapped signal
        rc=0
        wait "$CHILD_PID" || rc=$?
    done
    log "command exited with status $rc"
    exit "$rc"
}

main() {
    local subcommand=${1:-}
    [[ $# -gt 0 ]] && shift
    case $subcommand in
        install) cmd_install "$@" ;;
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        status) cmd_status "$@" ;;
        run) cmd_run "$@" ;;
        *)
            sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
            exit 2
            ;;
    esac
}

# On one line: bash reads a script as it runs it, and this file may be edited (e.g. by `git pull`)
# while a long `run` is under way.
main "$@"; exit
