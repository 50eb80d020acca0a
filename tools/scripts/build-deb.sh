#!/usr/bin/env bash
# Builds the Debian package of zblk: target/deb/zblk_VERSION_ARCH.deb.
#
#   tools/scripts/build-deb.sh [--no-build] [OUTDIR]
#
# It holds the release binary (/usr/bin/zblk), the systemd units
# (dist/systemd/) and generator (dist/systemd-generators/), the example configuration
# (/usr/share/doc/zblk/zblk.conf.example), the conffile /etc/zblk/zblk.conf
# (comments only: no device until one is written), and, when
# tools/scripts/gen-docs.sh exists, the man pages and shell completions it
# generates. --no-build packs target/release/zblk as it is; ZBLK_DEB_BIN=PATH
# packs that binary instead (the VM tests pack the static build they boot).
#
# Plain dpkg-deb rather than `cargo deb`: dpkg-deb is part of dpkg, on every
# Debian machine, while cargo-deb would have to be installed (fetched) first.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=1
if [[ ${1:-} == --no-build ]]; then
    build=0
    shift
fi
out=${1:-target/deb}

die() { echo "build-deb: $*" >&2; exit 1; }
command -v dpkg-deb >/dev/null || die "dpkg-deb is missing (apt-get install dpkg)"

# The workspace's version, from [workspace.package] of the root Cargo.toml.
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[[ -n $version ]] || die "no version in Cargo.toml's [workspace.package]"
arch=$(dpkg --print-architecture)

bin=${ZBLK_DEB_BIN:-target/release/zblk}
if ((build)) && [[ -z ${ZBLK_DEB_BIN:-} ]]; then
    cargo build --release --locked -p zblk-tools --bin zblk
fi
[[ -x $bin ]] || die "$bin is missing: build it (cargo build --release) or drop --no-build"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"

install -D -m 0755 "$bin" "$root/usr/bin/zblk"
# The release profile keeps line tables (debug = 1) for backtraces in the
# build tree; the package does without them.
if command -v strip >/dev/null; then
    strip --strip-debug "$root/usr/bin/zblk"
fi
for unit in dist/systemd/*.service; do
    install -D -m 0644 "$unit" "$root/usr/lib/systemd/system/$(basename "$unit")"
done
install -D -m 0755 dist/systemd-generators/zblk-generator \
    "$root/usr/lib/systemd/system-generators/zblk-generator"
install -D -m 0644 dist/zblk.conf "$root/etc/zblk/zblk.conf"
doc=$root/usr/share/doc/zblk
install -D -m 0644 dist/zblk.conf.example "$doc/zblk.conf.example"
install -D -m 0644 README.md "$doc/README.md"
# The reference pages the README links to, at the same relative paths.
for page in docs/*.md; do
    install -D -m 0644 "$page" "$doc/docs/$(basename "$page")"
done
cat >"$doc/copyright" <<COPYRIGHT
zblk: compressed RAM block devices served through ublk.
License: MIT or Apache-2.0, at your option.
COPYRIGHT

# Man pages (NAME.SECTION) and completions (bash: zblk.bash, zsh: _zblk,
# fish: zblk.fish), from clap, when the generator is there.
if [[ -x tools/scripts/gen-docs.sh ]]; then
    gen=$(mktemp -d)
    trap 'rm -rf "$root" "$gen"' EXIT
    # The binary being packed writes them, so they say what its --help says.
    ZBLK="$(realpath "$bin")" tools/scripts/gen-docs.sh "$gen" >/dev/null
    while IFS= read -r -d '' f; do
        name=$(basename "$f")
        case $name in
            *.[1-8])
                sect=${name##*.}
                install -D -m 0644 "$f" "$root/usr/share/man/man$sect/$name"
                gzip -9n "$root/usr/share/man/man$sect/$name"
                ;;
            zblk.bash) install -D -m 0644 "$f" "$root/usr/share/bash-completion/completions/zblk" ;;
            _zblk) install -D -m 0644 "$f" "$root/usr/share/zsh/vendor-completions/_zblk" ;;
            zblk.fish) install -D -m 0644 "$f" "$root/usr/share/fish/vendor_completions.d/zblk.fish" ;;
        esac
    done < <(find "$gen" -type f -print0)
fi

mkdir -p "$root/DEBIAN"
echo /etc/zblk/zblk.conf >"$root/DEBIAN/conffiles"
# Units are installed, not enabled: swap is the administrator's choice.
for script in postinst postrm; do
    cat >"$root/DEBIAN/$script" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
SCRIPT
    chmod 0755 "$root/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: zblk
Version: $version
Architecture: $arch
Maintainer: zblk developers <zblk@localhost>
Installed-Size: $size
Depends: libc6, util-linux
Recommends: e2fsprogs
Section: admin
Priority: optional
Description: compressed RAM block device (like zram) served through ublk
 zblk serves /dev/ublkbN from userspace through Linux ublk: pages written
 to it are compressed (lz4, zstd, deflate) and kept in RAM, built first of
 all to be a swap device. zblk-setup.service brings up the devices of
 /etc/zblk/zblk.conf at boot, before swap.target; a section with a
 mount-point is a filesystem, mounted before local-fs.target.
CONTROL

mkdir -p "$out"
deb=$out/zblk_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
