#!/usr/bin/env bash
# Builds the Debian package (tools/scripts/build-deb.sh) and checks it with
# dpkg-deb -I (control fields, conffiles) and dpkg-deb -c (contents), then
# unpacks it and runs the binary it holds. Run by hand; not part of
# tests/run.sh, because it builds the release binary (minutes).
#
#   tools/scripts/check-deb.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/../.."

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
deb=$(tools/scripts/build-deb.sh "$@" "$out")
fail=0
check() { # what, command...
    local what=$1
    shift
    if "$@"; then echo "PASS $what"; else echo "FAIL $what"; fail=1; fi
}

dpkg-deb -I "$deb"
contents=$(dpkg-deb -c "$deb")
field() { dpkg-deb -f "$deb" "$1"; }
check "Package: zblk" test "$(field Package)" = zblk
check "Version from Cargo.toml" test "$(field Version)" = \
    "$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)"
check "Architecture $(dpkg --print-architecture)" test "$(field Architecture)" = "$(dpkg --print-architecture)"
check "conffiles lists /etc/zblk/zblk.conf" \
    test "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)" = /etc/zblk/zblk.conf
for s in postinst postrm; do
    check "control script $s" bash -c 'dpkg-deb --ctrl-tarfile "$1" | tar -t | grep -qx "./$2"' _ "$deb" "$s"
done
for path in ./usr/bin/zblk ./usr/lib/systemd/system/zblk@.service \
    ./usr/lib/systemd/system/zblk-setup.service ./etc/zblk/zblk.conf \
    ./usr/lib/systemd/system-generators/zblk-generator \
    ./usr/share/doc/zblk/zblk.conf.example ./usr/share/doc/zblk/copyright; do
    check "contains $path" grep -q " $path\$" <<<"$contents"
done
check "every file owned by root" bash -c '! grep -v " root/root " <<<"$1" | grep -q .' _ "$contents"
check "usr/bin/zblk is 0755" grep -q '^-rwxr-xr-x root/root .* ./usr/bin/zblk$' <<<"$contents"
if [[ -x tools/scripts/gen-docs.sh ]]; then
    check "man page zblk.1" grep -q '/usr/share/man/man1/zblk.1.gz$' <<<"$contents"
    check "bash completion" grep -q '/usr/share/bash-completion/completions/zblk$' <<<"$contents"
else
    echo "SKIP man pages and completions (no tools/scripts/gen-docs.sh)"
fi

x=$out/x
dpkg-deb -x "$deb" "$x"
check "the binary runs" "$x/usr/bin/zblk" --version
check "the conffile is comments only" bash -c '! grep -v "^#" "$1" | grep -q .' _ "$x/etc/zblk/zblk.conf"
check "the packed example passes --dry-run" \
    "$x/usr/bin/zblk" setup --dry-run --config "$x/usr/share/doc/zblk/zblk.conf.example"
if command -v systemd-analyze >/dev/null; then
    # Only the missing /usr/bin/zblk of this machine may be reported.
    v=$(cd "$x/usr/lib/systemd/system" && systemd-analyze verify --man=no \
        ./zblk-setup.service ./zblk@.service 2>&1 | grep -v 'Command /usr/bin/zblk is not executable' || true)
    check "systemd-analyze verify" test -z "$v"
    [[ -z $v ]] || echo "$v"
fi
echo "$(basename "$deb"): $(du -h "$deb" | cut -f1)"
exit $fail
