#!/usr/bin/env bash
# tests/vm/run.sh: run zblk for real, as swap, on a real kernel with ublk_drv, in qemu.
#
# The host kernel may lack ublk, so this boots Debian's bookworm-backports 6.12
# kernel under qemu's software emulation (TCG) with a busybox initramfs holding
# static builds of `zblk` and the workload programs (`usemem`, `munmap_bench`),
# runs the guest scenarios in tests/vm/guest/scenarios/, and turns their
# `PASS <name> ...` / `FAIL <name> ...` lines into a summary and an exit code.
#
# Usage: bash tests/vm/run.sh [options]
#   --scenario NAME     run only this scenario (repeatable; default: all, in order
#                       swap munmap blockio stat lifecycle zram-compare
#                       swapkill, the last because its kill -9 of an active
#                       swap device's daemon leaves a dead swap area behind;
#                       also bench, by name only: the device benchmarks of
#                       tools/scripts/bench-device.sh, BENCH lines, no limits)
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
#   --timeout SECS      whole-boot limit (default 900); a hang is a failure
#   -h, --help          this text
#
# Environment knobs:
#   ZBLK_VM_CACHE   cache folder for the kernel and modules (default <repo>/.vmcache)
#   ZBLK_VM_WORK    work folder (default <repo>/tests/vm/work)
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
#   ZBLK_VM_KERNEL  kernel package version to pin (default: newest 6.12 in backports)
#   ZBLK_VM_NOBUILD=1  reuse the binaries already in target/ (no cargo build)
#   ZBLK_VM_ACCEL   qemu accelerator: tcg (default; works everywhere) or kvm
#                   (much faster where /dev/kvm can run a stock kernel)
#
# Exit code: 0 only when every selected scenario printed PASS. A scenario
# with no result line, a guest that never reached its end marker (hang,
# panic, timeout) or any FAIL line gives a non-zero exit.
#
# What it needs (installed with apt-get when missing, as root): qemu-system-x86,
# busybox-static, cpio, xz-utils, libclang-dev (libublk's bindgen), and network
# access to the machine's own configured Debian mirror for the kernel package
# (fetched once, then cached).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ZBLK_VM_CACHE:-$REPO/.vmcache}
WORK=${ZBLK_VM_WORK:-$REPO/tests/vm/work}
# swapkill runs last: it leaves a dead swap area the kernel cannot remove.
DEFAULT_SCENARIOS="swap munmap blockio stat lifecycle zram-compare swapkill"
# bench measures and is slow: run by name only (tools/scripts/bench-device.sh).
ALL_SCENARIOS="$DEFAULT_SCENARIOS bench"
SCENARIOS=""
MEM=2G
CPUS=2
KEEP=0
EXTRA=""
CARRY=()
DATA=()
TIMEOUT=900
TARGET=x86_64-unknown-linux-gnu

log() { printf '[vm] %s\n' "$*" >&2; }
die() { printf '[vm] error: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
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
        -h|--help) usage; exit 0;;
        *) die "unknown option '$1' (see --help)";;
        esac
    done
    SCENARIOS=${SCENARIOS:-$DEFAULT_SCENARIOS}
    SCENARIOS=$(echo $SCENARIOS)
}

# ---- host packages -------------------------------------------------------

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run: $*"; fi
}

missing_packages() {
    local pkg
    for pkg in qemu-system-x86 busybox-static cpio xz-utils libclang-dev; do
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

# apt-get/apt-cache over a private configuration that knows only bookworm-backports.
papt() {
    local tool=$1; shift
    "$tool" -o Dir::Etc::SourceList="$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$APTDIR/lists" -o Dir::State::status="$APTDIR/status" \
        -o Dir::Cache="$APTDIR/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root "$@"
}

# Prints the load order (dependencies first, relative paths) of module $2 in
# the unpacked module tree $1, from the `depends=` words of each module's
# .modinfo (the package ships no modules.dep and the host may lack depmod).
# Built-in modules (listed in modules.builtin) need no loading.
module_order() {
    local tree=$1 name=$2 path deps d
    case " $SEEN_MODS " in *" $name "*) return 0;; esac
    SEEN_MODS="$SEEN_MODS $name"
    if grep -q "/${name//_/[-_]}\.ko\$" "$tree/modules.builtin" 2>/dev/null; then return 0; fi
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

fetch_kernel() {
    KDIR=$CACHE/kernel
    if [ -f "$KDIR/ready" ] && { [ -z "${ZBLK_VM_KERNEL:-}" ] || grep -qx "$ZBLK_VM_KERNEL" "$KDIR/ready"; }; then
        log "kernel: cached $(cat "$KDIR/ready")"
        return 0
    fi
    APTDIR=$CACHE/apt
    rm -rf "$APTDIR" "$KDIR"
    mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" "$KDIR/modules"
    touch "$APTDIR/status"
    local uri keyring pkg deb x
    uri=$(mirror_uri)
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    if [ -f "$keyring" ]; then
        echo "deb [signed-by=$keyring] $uri bookworm-backports main" >"$APTDIR/sources.list"
    else
        echo "deb $uri bookworm-backports main" >"$APTDIR/sources.list"
    fi
    log "kernel: reading bookworm-backports from the configured mirror"
    papt apt-get update -qq >/dev/null || die "apt-get update of bookworm-backports failed"
    if [ -n "${ZBLK_VM_KERNEL:-}" ]; then
        pkg=linux-image-$ZBLK_VM_KERNEL
    else
        # The plain generic flavour (not -rt, -cloud, -dbg or -unsigned), newest first.
        pkg=$(papt apt-cache pkgnames linux-image-6.12 |
            grep -E '^linux-image-6\.12\.[0-9]+\+[a-z0-9.~]+-amd64$' | sort -V | tail -1 || true)
    fi
    [ -n "$pkg" ] || die "no linux-image-6.12 package in bookworm-backports"
    log "kernel: downloading $pkg"
    (cd "$APTDIR" && papt apt-get download -qq "$pkg" >/dev/null) || die "download of $pkg failed"
    deb=$(ls "$APTDIR"/linux-image-*.deb | head -1)
    x=$APTDIR/x
    dpkg-deb -x "$deb" "$x"
    local kver; kver=$(ls "$x/lib/modules" | head -1)
    [ -n "$kver" ] && [ -f "$x/boot/vmlinuz-$kver" ] || die "$deb holds no kernel image"
    cp "$x/boot/vmlinuz-$kver" "$KDIR/vmlinuz"
    local tree=$x/lib/modules/$kver m base list
    SEEN_MODS=""
    list=""
    for m in ublk_drv zram lz4_compress lz4hc_compress lzo_rle zstd_compress; do
        list="$list $(module_order "$tree" "$m")" || die "module $m or a dependency is missing from $pkg"
    done
    # module_order runs in a subshell per wanted module: drop repeated dependencies.
    list=$(printf '%s\n' $list | awk '!seen[$0]++')
    : >"$KDIR/modules/order"
    for m in $list; do
        base=$(basename "$m"); base=${base%.xz}; base=${base%.zst}; base=${base%.gz}
        decompress_module "$tree/$m" >"$KDIR/modules/$base"
        echo "$base" >>"$KDIR/modules/order"
    done
    grep -q '^ublk_drv.ko$' "$KDIR/modules/order" || die "$pkg has no ublk_drv module"
    echo "$kver" >"$KDIR/version"
    rm -rf "$x" "$APTDIR"/*.deb
    echo "${ZBLK_VM_KERNEL:-${pkg#linux-image-}}" >"$KDIR/ready"
    log "kernel: $kver cached in $KDIR (modules: $(tr '\n' ' ' <"$KDIR/modules/order"))"
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
        log "building static zblk, usemem, munmap_bench, randio"
        (cd "$REPO" && RUSTFLAGS='-C target-feature=+crt-static' \
            cargo build --release --target "$TARGET" -p zblk-tools \
            --bin zblk --bin usemem --bin munmap_bench --bin randio) >&2 || die "cargo build failed"
    fi
    local b
    for b in zblk usemem munmap_bench randio; do
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
    mkdir -p "$root"/{bin,sbin,dev,proc,sys,run,tmp,usr/bin,usr/sbin,usr/local/bin,lib/zblk-vm/modules}
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
    for b in zblk usemem munmap_bench randio; do cp "$BINDIR/$b" "$root/usr/local/bin/"; done
    # util-linux's swap and discard tools: busybox's lack --priority and -z.
    for b in swapon swapoff mkswap blkdiscard; do
        local p; p=$(command -v "$b" || true)
        if [ -n "$p" ]; then carry_program "$p" "$root" "/usr/sbin/$b"; else log "note: no $b on this host; the guest uses busybox's"; fi
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
    log "booting: $MEM, $CPUS cpus, scenarios: $SCENARIOS${EXTRA:+ + extra}"
    set +e
    local accel=(-accel tcg -cpu max)
    [ "${ZBLK_VM_ACCEL:-tcg}" = kvm ] && accel=(-accel kvm -cpu host)
    timeout -k 10 "$TIMEOUT" qemu-system-x86_64 "${accel[@]}" -m "$MEM" -smp "$CPUS" \
        -nographic -no-reboot -kernel "$KDIR/vmlinuz" -initrd "$WORK/initrd.img" \
        -append "$params" </dev/null 2>&1 | tee "$WORK/console.log" | sed -u 's/\r$//'
    QEMU_RC=${PIPESTATUS[0]}
    set -e
}

# Boots; if the kernel died before it ever ran /init (its first line is
# "zblk-vm: kernel ..."), boots again, at most twice more. qemu's
# multi-threaded TCG occasionally loses a race with the kernel's boot-time
# code patching (an int3 oops in early init, seen with 6.12); that says
# nothing about zblk. A guest that reached /init is never retried: whatever
# happens after that counts.
boot_until_init() {
    local try
    for try in 1 2 3; do
        boot
        grep -aq 'zblk-vm: kernel ' "$WORK/console.log" && return 0
        log "boot $try: the kernel died before /init (early boot oops under TCG); booting again"
        cp "$WORK/console.log" "$CACHE/early-boot-failure-$try.log" 2>/dev/null || true
    done
}

summarize() {
    local log=$WORK/console.log s line failed=0 results
    results=$(tr -d '\r' <"$log" | grep -E '^(PASS|FAIL) ' || true)
    echo
    echo "==================== zblk VM test summary ===================="
    for s in $SCENARIOS ${EXTRA:+extra}; do
        # A FAIL line wins over a PASS line of the same scenario (a timeout
        # after the PASS, a later check).
        line=$(echo "$results" | grep -E "^FAIL $s( |\$)" | head -1 || true)
        [ -n "$line" ] || line=$(echo "$results" | grep -E "^PASS $s( |\$)" | head -1 || true)
        if [ -z "$line" ]; then
            echo "FAIL $s (no result: the guest hung, crashed or timed out)"
            failed=1
        else
            echo "$line"
            case "$line" in FAIL*) failed=1;; esac
        fi
    done
    # Result lines the extra script printed under its own names.
    if [ -n "$EXTRA" ]; then
        echo "$results" | grep -vE "^(PASS|FAIL) ($(echo $SCENARIOS extra | tr ' ' '|'))( |\$)" || true
        echo "$results" | grep -vE "^(PASS|FAIL) ($(echo $SCENARIOS | tr ' ' '|'))( |\$)" | grep -q '^FAIL' && failed=1
    fi
    if ! tr -d '\r' <"$log" | grep -q '^zblk-vm: all done'; then
        echo "FAIL guest did not finish (qemu exit $QEMU_RC; timeout ${TIMEOUT}s)"
        failed=1
    fi
    echo "=============================================================="
    [ "$KEEP" = 1 ] && echo "work folder kept: $WORK (console.log, initrd.img, root/)"
    return $failed
}

main() {
    parse_args "$@"
    [ "$(uname -m)" = x86_64 ] || die "the VM tests boot an x86-64 kernel and need an x86-64 host"
    ensure_packages
    mkdir -p "$CACHE"
    fetch_kernel
    build_bins
    rm -rf "$WORK"
    mkdir -p "$WORK"
    pack_initramfs
    boot_until_init
    local rc=0
    summarize || rc=1
    if [ "$KEEP" != 1 ]; then
        # Keep the console log next to the work folder for CI artifacts.
        cp "$WORK/console.log" "$CACHE/last-console.log" 2>/dev/null || true
        rm -rf "$WORK"
        echo "console log: $CACHE/last-console.log"
    fi
    exit $rc
}

# Sourcing the file (for its functions) runs nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
