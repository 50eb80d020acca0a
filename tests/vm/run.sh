#!/usr/bin/env bash
# tests/vm/run.sh: run zblk for real, as swap, on a real kernel with ublk_drv, in qemu.
#
# The host kernel may lack ublk, so this boots Debian kernels under qemu's
# software emulation (TCG), one boot per kernel: 6.12 from bookworm-backports
# (the LTS users run) and 7.3 from trixie-backports (the newest Debian ships),
# each with a busybox initramfs holding static builds of `zblk` and the
# workload programs (`usemem`, `munmap_bench`, `randio`); runs the guest
# scenarios in tests/vm/guest/scenarios/ and turns their `PASS <name> ...` /
# `FAIL <name> ...` lines into a summary (one line per kernel and scenario,
# with the kernel's version) and an exit code.
#
# Usage: bash tests/vm/run.sh [options]
#   --kernel K          6.12, 7.3 or both (default both: the default suite takes
#                       about 11 min of qemu time per kernel under TCG, crash,
#                       soak and upgrade 4 min of it); repeatable and
#                       comma-separated too;
#                       the kernels boot one after the other, in the given order
#   --scenario NAME     run only this scenario (repeatable; default: all, in order
#                       swap munmap blockio stat lifecycle recompress exhaust soak
#                       filesystem crash upgrade security swapkill, the
#                       last because its kill -9 of an active swap device's daemon
#                       leaves a dead swap area behind (exhaust: the OOM killer
#                       with a full swap device, with and without --mem-limit;
#                       soak: mixed verified traffic on two devices for
#                       zblk.soak_s seconds; filesystem: ext4 and xfs on zblk,
#                       fstrim, fsck; xfs is skipped, with a SKIP line, when the
#                       host lacks xfsprogs or the kernel xfs; security: a
#                       non-root user is refused, the daemon's capabilities);
#                       also, by name only: zram-compare (zblk and zram back to
#                       back, ratios per round), bench (the device benchmarks of
#                       tools/scripts/bench-device.sh, BENCH lines, no limits),
#                       recovery-cost (shared vs private memory A/B, recovery
#                       time by stored size), transport-ab (BATCH_IO vs
#                       classic A/B, 7.x), tiering (writeback to a loop
#                       device and recompression under a hot/cold swap load)
#                       and wholemachine (a workload 1.5x the guest's RAM,
#                       no cgroup, on zram, zblk and zswap over brd: time
#                       to completion; see the scenario's header) and
#                       breakdown (where a swapped page's time goes: CPU
#                       by consumer and zblk's phase timers, BREAKDOWN lines)
#                       and thp (the swap workload in 4 KB pages, 64 KB mTHP
#                       and 2 MB THP folios, zram then zblk per size)
#                       and stall (one process of 1.5x RAM, no cgroup, run
#                       after run under a watchdog that captures a stall:
#                       see the scenario's header) and attrib (zblk stat
#                       --by cgroup against two cgroups' memory.swap.current,
#                       pages shared by a fork, one process's pagemap read
#                       in the guest against its row, writeback --cgroup;
#                       give it --data .../realmem-dev.bin.zst)
#                       and attrib-cost (the device's latency under swap,
#                       rounds alone and with zblk stat --by cgroup looping)
#                       and remote (the backing device on another machine:
#                       a second network namespace in the guest exports a
#                       file on the scratch disk through the kernel's NVMe
#                       over TCP target; writeback, swap-in, a dead link,
#                       latency against RAM and a local file; see its header))
#   --mem SIZE          guest memory (qemu -m syntax, default 2G)
#   --cpus N            guest vCPUs (default 2)
#   --keep              keep the work folder (initramfs, console log) and print it
#   --extra-script FILE guest shell script run after the scenarios, with zblk and
#                       the workload programs on PATH and guest/lib.sh sourced;
#                       its PASS/FAIL lines are counted like a scenario's, and
#                       it gets a PASS/FAIL "extra" line from its exit status
#   --data FILE         host data file copied into the guest as
#                       /lib/zblk-vm/data/<name> (repeatable): a page corpus
#   --carry PATH        host binary copied into the guest (/usr/local/bin) with the
#                       shared libraries `ldd` lists (repeatable): fio, stress-ng...
#   --timeout SECS      limit of each kernel's boot (default 900); a hang is a failure
#   --disk SIZE         a scratch disk of SIZE (truncate syntax, e.g. 2G): a
#                       sparse raw image in the work folder, the guest's
#                       /dev/vda (virtio), for data that must not live in
#                       guest RAM; given by default (2G) with the remote
#                       scenario
#   -h, --help          this text
#
# Environment knobs:
#   ZBLK_VM_CACHE   cache folder (default <repo>/.vmcache): each kernel in its
#                   own folder, kernel-6.12/ and kernel-7.3/ (vmlinuz, version,
#                   modules/), apt lists in apt-<K>/, the console log of the
#                   last boot in last-console.log and of each kernel in
#                   last-console-<K>.log
#   ZBLK_VM_WORK    work folder (default <repo>/tests/vm/work; one kernel-<K>/
#                   in it per kernel)
#   ZBLK_VM_ARGS    extra words for the guest kernel command line: the scenario
#                   knobs (defaults in tests/vm/guest/lib.sh), e.g.
#                   ZBLK_VM_ARGS='zblk.usemem_mb=512 zblk.compare_rounds=3'
#                     zblk.dev_mb=1024        swap device size (zblk and zram)
#                     zblk.limit_mb=128       memory.high of the workload cgroup
#                     zblk.usemem_procs=2     usemem processes
#                     zblk.usemem_mb=192      MB written by each usemem process
#                     zblk.munmap_sizes=64+256  munmap regions in MB
#                     zblk.munmap_procs=1     processes unmapping at once
#                     zblk.algo=lz4           algorithm of both devices
#                     zblk.settle_s=10        time allowed to fall back after munmap
#                     zblk.compare_rounds=1   zram/zblk pairs in zram-compare
#                     zblk.timeout=360        limit per scenario in the guest
#                     zblk.soak_s=60          traffic time of the soak scenario;
#                       ZBLK_VM_ARGS='zblk.soak_s=600 zblk.timeout=900' with
#                       --scenario soak --timeout 1500 is the 10-minute soak
#                       (opt-in: too long for CI's default run)
#   ZBLK_VM_KERNEL  kernel package version to pin, e.g. 6.12.95+deb12-amd64
#                   (applies to the kernel of its series; default: the newest
#                   of each series in its backports suite)
#   ZBLK_VM_NOBUILD=1  reuse the binaries already in target/ (no cargo build)
#   ZBLK_VM_MONITOR=1  a qemu monitor socket and SysRq, to ask a stuck guest
#                   where it is (see boot())
#   ZBLK_VM_SYSRQ_SILENCE=SECS  with ZBLK_VM_MONITOR=1: when the console has
#                   been silent SECS seconds, SysRq 9, t, w, l and m are sent by
#                   tools/scripts/vm-sysrq-watch.py (again every 5 minutes
#                   while it stays silent); the dumps land in console.log
#   ZBLK_VM_ACCEL   qemu accelerator: tcg (default; works everywhere) or kvm
#                   (much faster where /dev/kvm can run a stock kernel)
#
# Exit code: 0 only when every selected scenario printed PASS on every
# selected kernel. A scenario with no result line, a guest that never reached
# its end marker (hang, panic, timeout) or any FAIL line gives a non-zero
# exit; a failing kernel does not stop the next one from booting.
#
# What it needs (installed with apt-get when missing, as root): qemu-system-x86,
# busybox-static, cpio, xz-utils, libclang-dev (libublk's bindgen), e2fsprogs
# and xfsprogs (mkfs, fsck and fstrim for the filesystem scenario), and network
# access to the machine's own configured Debian mirror for the kernel packages
# (fetched once per kernel, then cached).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ZBLK_VM_CACHE:-$REPO/.vmcache}
WORK=${ZBLK_VM_WORK:-$REPO/tests/vm/work}
# swapkill runs last: it leaves a dead swap area the kernel cannot remove.
DEFAULT_SCENARIOS="swap munmap blockio stat lifecycle recompress exhaust soak filesystem crash upgrade security swapkill"
# bench measures and is slow: run by name only (tools/scripts/bench-device.sh).
ALL_SCENARIOS="$DEFAULT_SCENARIOS zram-compare bench recovery-cost transport-ab tiering wholemachine breakdown thp stall attrib attrib-cost remote"
# Scenarios that need the scratch disk (--disk): its size when none is given.
DISK_SCENARIOS="remote"
DISK_DEFAULT=2G
SCENARIOS=""
MEM=2G
CPUS=2
KEEP=0
EXTRA=""
CARRY=()
DATA=()
TIMEOUT=900
DISK=""
TARGET=x86_64-unknown-linux-gnu
# Host programs the filesystem scenario runs in the guest (/usr/sbin).
FS_TOOLS="mkfs.ext4 e2fsck mkfs.xfs xfs_repair fstrim"
# iproute2's ip (/usr/sbin): busybox's has no netns and cannot make a veth
# pair, which the remote scenario's second network namespace needs.
NET_TOOLS="ip"
KNOWN_KERNELS="6.12 7.3"
# Kernel modules packed into the guest, dependencies first: those every
# scenario needs (a kernel package without them is refused) and those only
# the filesystem scenario (and loop, tiering's backing device) needs (a
# note when missing; the scenario then fails for ext4 and skips xfs, each
# with its own line). crc32c comes before
# ext4 and xfs: they ask the crypto API for it at mount time (a soft
# dependency, not in depends=), and the guest has no modprobe to load it.
NEED_MODULES="ublk_drv zram lz4_compress lz4hc_compress lzo_rle zstd_compress"
# brd and the crypto API's lz4 and zstd: zswap over a ramdisk (wholemachine).
# virtio_pci and virtio_blk: the scratch disk (--disk); veth, the kernel's
# NVMe-oF target over TCP (nvmet_tcp, with nvmet and configfs) and its
# initiator (nvme_tcp, with nvme_core and nvme_fabrics): the remote tier.
OPT_MODULES="crc32c_generic crc32c_intel ext4 xfs loop brd lz4 zstd virtio_pci virtio_blk veth nvmet_tcp nvme_tcp"
DEFAULT_KERNELS="6.12 7.3"
KERNELS=""

log() { printf '[vm] %s\n' "$*" >&2; }
die() { printf '[vm] error: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
        --kernel) [ $# -ge 2 ] || die "--kernel needs 6.12, 7.3 or both"
            local k
            for k in $(echo "$2" | tr ',' ' '); do
                case "$k" in
                both|all) KERNELS="$KERNELS $KNOWN_KERNELS";;
                *) case " $KNOWN_KERNELS " in *" $k "*) KERNELS="$KERNELS $k";; *) die "unknown kernel '$k' (known: $KNOWN_KERNELS, both)";; esac;;
                esac
            done
            shift 2;;
        --scenario) [ $# -ge 2 ] || die "--scenario needs a name"
            case " $ALL_SCENARIOS " in *" $2 "*) ;; *) die "unknown scenario '$2' (known: $ALL_SCENARIOS)";; esac
            SCENARIOS="$SCENARIOS $2"; shift 2;;
        --mem) [ $# -ge 2 ] || die "--mem needs a size"; MEM=$2; shift 2;;
        --cpus) [ $# -ge 2 ] || die "--cpus needs a count"; CPUS=$2; shift 2;;
        --keep) KEEP=1; shift;;
        --extra-script) [ $# -ge 2 ] && [ -f "$2" ] || die "--extra-script needs an existing file"
            EXTRA=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2;;
        --carry) [ $# -ge 2 ] || die "--carry needs a path"
            local p; p=$(command -v "$2" || true); [ -n "$p" ] && [ -f "$p" ] || die "--carry: no such program '$2'"
            CARRY+=("$p"); shift 2;;
        --data) [ $# -ge 2 ] && [ -f "$2" ] || die "--data needs an existing file"
            DATA+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2;;
        --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; TIMEOUT=$2; shift 2;;
        --disk) [ $# -ge 2 ] || die "--disk needs a size"; DISK=$2; shift 2;;
        -h|--help) usage; exit 0;;
        *) die "unknown option '$1' (see --help)";;
        esac
    done
    SCENARIOS=${SCENARIOS:-$DEFAULT_SCENARIOS}
    SCENARIOS=$(echo $SCENARIOS)
    local s
    for s in $SCENARIOS; do
        case " $DISK_SCENARIOS " in *" $s "*) DISK=${DISK:-$DISK_DEFAULT};; esac
    done
    KERNELS=$(printf '%s\n' ${KERNELS:-$DEFAULT_KERNELS} | awk '!seen[$0]++' | tr '\n' ' ')
    KERNELS=$(echo $KERNELS)
}

# ---- host packages -------------------------------------------------------

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run: $*"; fi
}

missing_packages() {
    local pkg
    for pkg in qemu-system-x86 busybox-static cpio xz-utils libclang-dev e2fsprogs xfsprogs; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || echo "$pkg"
    done
}

ensure_packages() {
    local miss
    miss=$(missing_packages | tr '\n' ' ')
    [ -z "${miss// /}" ] && return 0
    log "installing: $miss"
    export DEBIAN_FRONTEND=noninteractive
    # Install from the lists already there; refresh them only when that fails.
    if ! as_root apt-get install -y --no-install-recommends $miss >/dev/null 2>&1; then
        as_root apt-get update -qq
        as_root apt-get install -y --no-install-recommends $miss >/dev/null
    fi
}

# ---- kernel --------------------------------------------------------------

# The first Debian mirror URI of the machine's own apt configuration, so that
# no mirror host name is ever written into this repository.
mirror_uri() {
    local f uri=""
    f=/etc/apt/sources.list.d/debian.sources
    if [ -f "$f" ]; then
        uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
    fi
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } ; break } }')
    fi
    [ -n "$uri" ] || die "no Debian mirror URI in /etc/apt/sources.list.d/debian.sources or sources.list"
    echo "$uri"
}

# The Debian suite each supported kernel series comes from.
kernel_suite() {
    case "$1" in
    6.12) echo bookworm-backports;;
    7.3) echo trixie-backports;;
    *) die "unknown kernel '$1' (known: $KNOWN_KERNELS)";;
    esac
}

# apt-get/apt-cache over a private configuration ($APTDIR) that knows only
# the one backports suite of the kernel being fetched.
papt() {
    local tool=$1; shift
    "$tool" -o Dir::Etc::SourceList="$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$APTDIR/lists" -o Dir::State::status="$APTDIR/status" \
        -o Dir::Cache="$APTDIR/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root "$@"
}

# Prints the load order (dependencies first, relative paths) of module $2 in
# the unpacked module tree $1, from the `depends=` words of each module's
# .modinfo (the package ships no modules.dep and the host may lack depmod).
# A built-in module (listed in modules.builtin: 7.3 builds lz4, lzo-rle and
# zstd in) needs no loading: its name goes to $BUILTIN_LIST instead, for the
# guest to report. Runs in a command substitution, hence the file.
module_order() {
    local tree=$1 name=$2 path deps d
    case " $SEEN_MODS " in *" $name "*) return 0;; esac
    SEEN_MODS="$SEEN_MODS $name"
    if grep -q "/${name//[-_]/[-_]}\.ko\$" "$tree/modules.builtin" 2>/dev/null; then
        echo "$name" >>"$BUILTIN_LIST"
        return 0
    fi
    path=$(cd "$tree" && find kernel -name '*.ko*' | grep -E "/${name//[-_]/[-_]}\.ko(\.(xz|zst|gz))?\$" | head -1)
    [ -n "$path" ] || return 1
    deps=$(decompress_module "$tree/$path" | grep -a -o 'depends=[A-Za-z0-9_,-]*' | head -1 | sed 's/^depends=//; s/,/ /g')
    for d in $deps; do module_order "$tree" "$d" || return 1; done
    echo "$path"
}

decompress_module() {
    case "$1" in
    *.xz) xz -dc "$1";;
    *.zst) zstd -qdc "$1";;
    *.gz) gzip -dc "$1";;
    *) cat "$1";;
    esac
}

# The package version ZBLK_VM_KERNEL pins for series $1 (empty: the newest).
kernel_pin() {
    case "${ZBLK_VM_KERNEL:-}" in "$1".*) echo "$ZBLK_VM_KERNEL";; esac
}

# Fetches kernel series $1 (6.12 or 7.3) into $CACHE/kernel-$1 unless it is
# there already, and sets KDIR to that folder: vmlinuz, version (uname -r),
# ready (the package version), modules/*.ko (decompressed), modules/order
# (insmod order) and modules/builtin (wanted modules the kernel has built in).
#   6.12 (bookworm-backports): linux-image-6.12.N+deb12-amd64 holds it all,
#     boot/vmlinuz-<ver> and lib/modules/<ver>/.
#   7.3 (trixie-backports): linux-image-7.3.N+deb13-amd64 is a meta package;
#     its dependencies hold usr/lib/modules/<ver>/vmlinuz (linux-binary-*),
#     the modules (linux-modules-*) and modules.builtin (linux-base-*).
fetch_kernel() {
    local series=$1 suite pin
    suite=$(kernel_suite "$series")
    pin=$(kernel_pin "$series")
    KDIR=$CACHE/kernel-$series
    # The cache of the days of one kernel: $CACHE/kernel held a 6.12.
    if [ "$series" = 6.12 ] && [ ! -e "$KDIR" ] && [ -f "$CACHE/kernel/ready" ] && grep -q '^6\.12\.' "$CACHE/kernel/ready"; then
        mv "$CACHE/kernel" "$KDIR"
        rm -rf "$CACHE/apt"
    fi
    if [ -f "$KDIR/ready" ] && { [ -z "$pin" ] || grep -qx "$pin" "$KDIR/ready"; }; then
        if [ "$(cat "$KDIR/modules/wanted" 2>/dev/null)" = "$NEED_MODULES $OPT_MODULES" ]; then
            log "kernel $series: cached $(cat "$KDIR/ready")"
            return 0
        fi
        log "kernel $series: the cache holds another module list; fetching again"
    fi
    APTDIR=$CACHE/apt-$series
    rm -rf "$APTDIR" "$KDIR"
    mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" "$KDIR/modules"
    touch "$APTDIR/status"
    local uri keyring pkg ver deb x d
    uri=$(mirror_uri)
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    if [ -f "$keyring" ]; then
        echo "deb [signed-by=$keyring] $uri $suite main" >"$APTDIR/sources.list"
    else
        echo "deb $uri $suite main" >"$APTDIR/sources.list"
    fi
    log "kernel $series: reading $suite from the configured mirror"
    papt apt-get update -qq >/dev/null || die "apt-get update of $suite failed"
    if [ -n "$pin" ]; then
        ver=$pin
    else
        # The plain generic flavour (not -rt, -cloud, -dbg or -unsigned), newest first.
        ver=$(papt apt-cache pkgnames "linux-image-$series" |
            grep -E "^linux-image-${series//./\\.}\\.[0-9]+\\+[a-z0-9.~]+-amd64\$" | sort -V | tail -1 || true)
        ver=${ver#linux-image-}
    fi
    [ -n "$ver" ] || die "no linux-image-$series package in $suite"
    pkg=linux-image-$ver
    log "kernel $series: downloading $pkg"
    (cd "$APTDIR" && papt apt-get download -qq "$pkg" >/dev/null) || die "download of $pkg failed"
    x=$APTDIR/x
    rm -rf "$x"
    deb=$(ls "$APTDIR"/linux-image-*.deb | head -1)
    dpkg-deb -x "$deb" "$x"
    if [ -z "$(find "$x" -name 'vmlinuz*' -print -quit)" ]; then
        # A meta package: fetch the dependencies of this very version that
        # hold the kernel, its modules and its module lists.
        local deps
        deps=$(dpkg-deb -f "$deb" Depends | tr ',|' '\n\n' | sed 's/(.*//; s/[[:space:]]//g' |
            grep -Fx -e "linux-binary-$ver" -e "linux-modules-$ver" -e "linux-base-$ver" || true)
        [ -n "$deps" ] || die "$pkg holds no kernel and depends on no linux-binary-$ver"
        log "kernel $series: $pkg is a meta package; downloading $(echo $deps)"
        (cd "$APTDIR" && papt apt-get download -qq $deps >/dev/null) || die "download of $(echo $deps) failed"
        for d in $deps; do
            dpkg-deb -x "$(ls "$APTDIR/${d}"_*.deb | head -1)" "$x"
        done
    fi
    local mods kver vmlinuz
    mods=$(ls -d "$x"/usr/lib/modules/* "$x"/lib/modules/* 2>/dev/null | head -1 || true)
    [ -n "$mods" ] || die "$pkg (and its dependencies) hold no lib/modules/<version>"
    kver=$(basename "$mods")
    for vmlinuz in "$x/boot/vmlinuz-$kver" "$mods/vmlinuz" ""; do
        [ -f "$vmlinuz" ] && break
    done
    [ -n "$vmlinuz" ] || die "$pkg (and its dependencies) hold no kernel image for $kver"
    cp "$vmlinuz" "$KDIR/vmlinuz"
    local m base list
    SEEN_MODS=""
    BUILTIN_LIST=$KDIR/modules/builtin
    : >"$BUILTIN_LIST"
    list=""
    for m in $NEED_MODULES; do
        list="$list $(module_order "$mods" "$m")" || die "module $m or a dependency is missing from $pkg"
    done
    local o
    for m in $OPT_MODULES; do
        if o=$(module_order "$mods" "$m"); then list="$list $o"; else log "note: no module $m in $pkg"; fi
    done
    # module_order runs in a subshell per wanted module: drop repeated names.
    list=$(printf '%s\n' $list | awk '!seen[$0]++')
    sort -u -o "$BUILTIN_LIST" "$BUILTIN_LIST"
    : >"$KDIR/modules/order"
    for m in $list; do
        base=$(basename "$m"); base=${base%.xz}; base=${base%.zst}; base=${base%.gz}
        decompress_module "$mods/$m" >"$KDIR/modules/$base"
        echo "$base" >>"$KDIR/modules/order"
    done
    grep -q '^ublk_drv.ko$' "$KDIR/modules/order" || grep -qx ublk_drv "$BUILTIN_LIST" ||
        die "$pkg has no ublk_drv module"
    echo "$kver" >"$KDIR/version"
    echo "$NEED_MODULES $OPT_MODULES" >"$KDIR/modules/wanted"
    rm -rf "$x" "$APTDIR"/*.deb
    echo "$ver" >"$KDIR/ready"
    log "kernel $series: $kver cached in $KDIR (modules: $(tr '\n' ' ' <"$KDIR/modules/order")built in: $(tr '\n' ' ' <"$BUILTIN_LIST"))"
}

# ---- guest binaries --------------------------------------------------------

# Static builds of zblk and the workload programs (no libraries in the guest).
build_bins() {
    # Where cargo puts its output (CARGO_TARGET_DIR or a config may move it).
    local tdir
    tdir=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
        grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4 || true)
    BINDIR=${tdir:-${CARGO_TARGET_DIR:-$REPO/target}}/$TARGET/release
    if [ "${ZBLK_VM_NOBUILD:-0}" != 1 ]; then
        command -v cargo >/dev/null || die "cargo not found (install Rust: https://rustup.rs)"
        log "building static zblk, usemem, munmap_bench, randio, stallwatch"
        (cd "$REPO" && RUSTFLAGS='-C target-feature=+crt-static' \
            cargo build --release --target "$TARGET" -p zblk-tools \
            --bin zblk --bin usemem --bin munmap_bench --bin randio --bin stallwatch) >&2 || die "cargo build failed"
    fi
    local b
    for b in zblk usemem munmap_bench randio stallwatch; do
        [ -x "$BINDIR/$b" ] || die "missing $BINDIR/$b"
    done
}

# Copies program $1 and the libraries ldd lists into root $2 (same paths).
carry_program() {
    local prog=$1 root=$2 dest=${3:-} lib
    [ -n "$dest" ] || dest=/usr/local/bin/$(basename "$prog")
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$prog" "$root$dest"
    for lib in $(ldd "$prog" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [ -e "$root$lib" ] && continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}

# ---- initramfs -------------------------------------------------------------

pack_initramfs() {
    local root=$WORK/root busybox b
    rm -rf "$root"
    mkdir -p "$root"/{bin,sbin,dev,etc,proc,sys,run,tmp,usr/bin,usr/sbin,usr/local/bin,lib/zblk-vm/modules}
    # A non-root user for the security scenario (busybox su needs it).
    printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    busybox=$(dpkg -L busybox-static 2>/dev/null | grep -E '/bin/busybox$' | head -1 || true)
    [ -n "$busybox" ] || busybox=$(command -v busybox)
    file -L "$busybox" 2>/dev/null | grep -q dynamically && die "$busybox is not static (install busybox-static)"
    cp -L "$busybox" "$root/bin/busybox"
    # /init is a script: its interpreter must exist before busybox --install runs.
    ln -s busybox "$root/bin/sh"
    [ -e "$root/dev/console" ] || mknod "$root/dev/console" c 5 1 2>/dev/null || true
    cp "$HERE/guest/init" "$root/init"
    chmod +x "$root/init"
    cp "$HERE/guest/lib.sh" "$root/lib/zblk-vm/lib.sh"
    cp -r "$HERE/guest/scenarios" "$root/lib/zblk-vm/scenarios"
    [ -n "$EXTRA" ] && cp "$EXTRA" "$root/lib/zblk-vm/extra.sh"
    cp "$KDIR"/modules/*.ko "$KDIR/modules/order" "$root/lib/zblk-vm/modules/"
    [ -f "$KDIR/modules/builtin" ] && cp "$KDIR/modules/builtin" "$root/lib/zblk-vm/modules/"
    for b in zblk usemem munmap_bench randio stallwatch; do cp "$BINDIR/$b" "$root/usr/local/bin/"; done
    # util-linux's swap and discard tools: busybox's lack --priority and -z.
    for b in swapon swapoff mkswap blkdiscard; do
        local p; p=$(command -v "$b" || true)
        if [ -n "$p" ]; then carry_program "$p" "$root" "/usr/sbin/$b"; else log "note: no $b on this host; the guest uses busybox's"; fi
    done
    # The filesystem scenario's tools (e2fsprogs, xfsprogs): carried when the
    # host has them; the scenario says what it misses.
    for b in $FS_TOOLS; do
        local p; p=$(command -v "$b" || true)
        if [ -n "$p" ]; then carry_program "$p" "$root" "/usr/sbin/$b"; else log "note: no $b on this host; the filesystem scenario will miss it"; fi
    done
    for b in $NET_TOOLS; do
        local p; p=$(command -v "$b" || true)
        if [ -n "$p" ]; then carry_program "$p" "$root" "/usr/sbin/$b"; else log "note: no $b (iproute2) on this host; the remote scenario will miss it"; fi
    done
    for b in "${CARRY[@]+"${CARRY[@]}"}"; do carry_program "$b" "$root"; done
    if [ ${#DATA[@]} -gt 0 ]; then
        mkdir -p "$root/lib/zblk-vm/data"
        cp "${DATA[@]}" "$root/lib/zblk-vm/data/"
    fi
    (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$WORK/initrd.img"
    log "initramfs: $(du -h "$WORK/initrd.img" | cut -f1)"
}

# ---- boot and results --------------------------------------------------------

boot() {
    local scen params
    scen=$(echo $SCENARIOS | tr ' ' ',')
    params="console=ttyS0 panic=-1 loglevel=4 zblk.scenarios=$scen ${ZBLK_VM_ARGS:-}"
    log "booting $(cat "$KDIR/version"): $MEM, $CPUS cpus, scenarios: $SCENARIOS${EXTRA:+ + extra}${DISK:+, scratch disk $DISK}"
    local disk=()
    if [ -n "$DISK" ]; then
        # Sparse and new each boot: the guest makes its own file system.
        rm -f "$WORK/scratch.img"
        truncate -s "$DISK" "$WORK/scratch.img" || die "cannot make a $DISK scratch disk in $WORK"
        disk=(-drive "file=$WORK/scratch.img,format=raw,if=virtio")
    fi
    set +e
    local accel=(-accel tcg -cpu max)
    [ "${ZBLK_VM_ACCEL:-tcg}" = kvm ] && accel=(-accel kvm -cpu host)
    # ZBLK_VM_MONITOR=1: a qemu monitor on $WORK/monitor.sock and SysRq on,
    # so that a stuck guest can be asked where it is, e.g.
    #   echo 'sendkey alt-sysrq-l' | socat - UNIX-CONNECT:$WORK/monitor.sock
    # (l: every CPU's backtrace, w: blocked tasks, t: all tasks; printed on
    # the console, so in console.log).
    if [ "${ZBLK_VM_MONITOR:-0}" = 1 ]; then
        accel+=(-monitor "unix:$WORK/monitor.sock,server,nowait")
        params="$params sysrq_always_enabled=1"
    fi
    local watch=""
    : >"$WORK/console.log"
    if [ "${ZBLK_VM_MONITOR:-0}" = 1 ] && [ -n "${ZBLK_VM_SYSRQ_SILENCE:-}" ]; then
        python3 "$REPO/tools/scripts/vm-sysrq-watch.py" "$WORK/console.log" \
            "$WORK/monitor.sock" "$ZBLK_VM_SYSRQ_SILENCE" $$ &
        watch=$!
    fi
    timeout -k 10 "$TIMEOUT" qemu-system-x86_64 "${accel[@]}" -m "$MEM" -smp "$CPUS" \
        -nographic -no-reboot -kernel "$KDIR/vmlinuz" -initrd "$WORK/initrd.img" \
        -append "$params" "${disk[@]+"${disk[@]}"}" </dev/null 2>&1 | tee "$WORK/console.log" | sed -u 's/\r$//'
    QEMU_RC=${PIPESTATUS[0]}
    [ -n "$watch" ] && kill "$watch" 2>/dev/null
    set -e
}

# Boots; if the kernel died before the first scenario began (before /init
# printed "zblk-vm: === <name>"), boots again, at most twice more. qemu's
# multi-threaded TCG occasionally loses a race with the kernel's code
# patching (an int3 oops in early init, seen with 6.12); a crash before
# the first scenario, when only busybox and insmod have run, says nothing
# about zblk.
# A guest that began a scenario is never retried: whatever happens after
# that counts. Each retried boot's console is kept in the cache as
# early-boot-failure-<K>-<try>.log.
boot_until_init() {
    local try
    for try in 1 2 3; do
        boot
        grep -aq 'zblk-vm: === ' "$WORK/console.log" && return 0
        grep -aq 'zblk-vm: all done' "$WORK/console.log" && return 0
        log "boot $try: the kernel died before the first scenario (before zblk ran); booting again"
        cp "$WORK/console.log" "$CACHE/early-boot-failure-$KSERIES-$try.log" 2>/dev/null || true
    done
}

# Adds the result lines of the boot of kernel $KSERIES to $SUMMARY, each
# with the kernel's version after the scenario's name; fails when any
# selected scenario did not pass there.
summarize() {
    local log=$WORK/console.log s line failed=0 results tag oops
    tag="[$KVER]"
    results=$(tr -d '\r' <"$log" | grep -aE '^(PASS|FAIL) ' || true)
    for s in $SCENARIOS ${EXTRA:+extra}; do
        # A FAIL line wins over a PASS line of the same scenario (a timeout
        # after the PASS, a later check).
        line=$(echo "$results" | grep -E "^FAIL $s( |\$)" | head -1 || true)
        [ -n "$line" ] || line=$(echo "$results" | grep -E "^PASS $s( |\$)" | head -1 || true)
        if [ -z "$line" ]; then
            line="FAIL $s (no result: the guest hung, crashed or timed out)"
            failed=1
        else
            case "$line" in FAIL*) failed=1;; esac
        fi
        SUMMARY="$SUMMARY$(echo "$line" | with_kernel "$tag")"$'\n'
    done
    # Result lines the extra script printed under its own names.
    if [ -n "$EXTRA" ]; then
        line=$(echo "$results" | grep -vE "^(PASS|FAIL) ($(echo $SCENARIOS extra | tr ' ' '|'))( |\$)" || true)
        [ -n "$line" ] && SUMMARY="$SUMMARY$(echo "$line" | with_kernel "$tag")"$'\n'
        echo "$results" | grep -vE "^(PASS|FAIL) ($(echo $SCENARIOS | tr ' ' '|'))( |\$)" | grep -q '^FAIL' && failed=1
    fi
    if ! tr -d '\r' <"$log" | grep -aq '^zblk-vm: all done'; then
        SUMMARY="${SUMMARY}FAIL guest $tag did not finish (qemu exit $QEMU_RC; timeout ${TIMEOUT}s)$(last_step "$log")"$'\n'
        oops=$(kernel_oops "$log")
        [ -z "$oops" ] || SUMMARY="$SUMMARY$oops"$'\n'
        failed=1
    fi
    return $failed
}

# ", last step: <the guest's last zblk-vm: line>" of console log $1.
last_step() {
    local l
    l=$(tr -d '\r' <"$1" | grep -a '^zblk-vm: ' | tail -1)
    [ -z "$l" ] || printf ', last step: %s' "${l#zblk-vm: }"
}

# The first kernel oops of console log $1 (from its "BUG:", "Oops:" or
# "general protection" line through "Kernel panic", at most 60 lines, each
# indented), so that a crashed guest explains itself in the summary, which
# is what a CI log keeps.
kernel_oops() {
    tr -d '\r' <"$1" | awk '
        !on && /(BUG:|Oops:|general protection|kernel BUG|Kernel panic)/ { on = 1 }
        on && n < 60 { print "    " $0; n++ }
        on && /Kernel panic/ { exit }'
}

# "PASS name rest" -> "PASS name [version] rest".
with_kernel() { sed -E "s/^(PASS|FAIL) ([^ ]+)/\\1 \\2 $(printf '%s' "$1" | sed 's/[][\/.&]/\\&/g')/"; }

# Fetches, packs and boots kernel series $1; adds its results to $SUMMARY
# and sets KRC to 1 when a scenario failed there. (It returns 0 so that the
# caller need not test it, which would switch set -e off inside.)
run_kernel() {
    KSERIES=$1
    KRC=0
    local t0=$SECONDS
    fetch_kernel "$KSERIES"
    KVER=$(cat "$KDIR/version")
    WORK=$WORK_ROOT/kernel-$KSERIES
    rm -rf "$WORK"
    mkdir -p "$WORK"
    pack_initramfs
    boot_until_init
    summarize || KRC=1
    TIMES="$TIMES kernel $KSERIES ($KVER): $((SECONDS - t0)) s;"
    # Keep the console logs next to the work folder for CI artifacts.
    cp "$WORK/console.log" "$CACHE/last-console-$KSERIES.log" 2>/dev/null || true
    cp "$WORK/console.log" "$CACHE/last-console.log" 2>/dev/null || true
    LOGS="$LOGS $CACHE/last-console-$KSERIES.log"
    [ "$KEEP" = 1 ] || rm -rf "$WORK"
}

main() {
    parse_args "$@"
    [ "$(uname -m)" = x86_64 ] || die "the VM tests boot an x86-64 kernel and need an x86-64 host"
    ensure_packages
    mkdir -p "$CACHE"
    # Every kernel is fetched before anything is built or booted, so that a
    # download failure shows at once.
    local k rc=0 pinned=0
    if [ -n "${ZBLK_VM_KERNEL:-}" ]; then
        for k in $KERNELS; do [ -n "$(kernel_pin "$k")" ] && pinned=1; done
        [ $pinned = 1 ] || die "ZBLK_VM_KERNEL=$ZBLK_VM_KERNEL is no kernel of the selected series ($KERNELS)"
    fi
    for k in $KERNELS; do fetch_kernel "$k"; done
    build_bins
    WORK_ROOT=$WORK
    rm -rf "$WORK_ROOT"
    SUMMARY="" TIMES="" LOGS=""
    for k in $KERNELS; do
        run_kernel "$k"
        [ "$KRC" = 0 ] || rc=1
    done
    echo
    echo "==================== zblk VM test summary ===================="
    printf '%s' "$SUMMARY"
    echo "time:$TIMES"
    if [ $rc = 0 ]; then echo "ALL PASS on kernels $KERNELS"; else echo "FAILED (see above)"; fi
    echo "=============================================================="
    if [ "$KEEP" = 1 ]; then
        echo "work folders kept: $(for k in $KERNELS; do printf '%s ' "$WORK_ROOT/kernel-$k"; done)(console.log, initrd.img, root/)"
    else
        rmdir "$WORK_ROOT" 2>/dev/null || true
    fi
    echo "console logs:$LOGS"
    exit $rc
}

# Sourcing the file (for its functions) runs nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
