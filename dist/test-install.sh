#!/bin/bash
# The install test (`make test-install`, also run by `make test`): install into a temporary
# prefix, build C programs with nothing but `pkg-config --cflags --libs pagewise` and run them,
# check the installed binary, man pages, completions, unit and example config, uninstall, and
# check that nothing is left. Then the same with DESTDIR (a packager's staged install), and an
# uninstall that must keep a file Pagewise did not install. Prints "install test: ok" or fails
# naming the step.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
make=${MAKE:-make}
work=$(mktemp -d /tmp/pagewise-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

fail() { echo "install test: FAILED: $*" >&2; exit 1; }
step() { echo "install test: $*"; }

minst() { "$make" -s --no-print-directory -C "$src" "$@" >"$work/make.log" 2>&1 || { cat "$work/make.log" >&2; fail "make $*"; }; }

prefix=$work/prefix
step "make install PREFIX=$prefix"
minst install PREFIX="$prefix"
[ -x "$prefix/bin/pagewise" ] || fail "no $prefix/bin/pagewise"
grep -q '^pagewise ' <<<"$("$prefix/bin/pagewise" --version)" || fail "installed pagewise --version"

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs pagewise) || fail "pkg-config --cflags --libs pagewise"
case "$flags" in *"-I$prefix/include"*"-L$prefix/lib"*"-lpagewise"*) ;; *) fail "pkg-config flags: $flags" ;; esac
[ "$(pkg-config --modversion pagewise)" = "$(sed -n 's/^version = "\(.*\)"/\1/p' "$src/Cargo.toml" | head -n1)" ] \
    || fail "pkg-config --modversion"

step "a C program built with pkg-config"
cat > "$work/t.c" <<'C'
#include <stdio.h>
#include "pagewise.h"
int main(void) {
    struct hps_config cfg;
    struct pw_reclaim_watermarks w;
    if (hps_config_default(&cfg) != 0) return 1;
    if (pw_reclaim_watermarks(12288, 240, 400, &w) != 0) return 2;
    if (pw_reclaim_watermarks(12288, 90, 400, &w) >= 0) return 3; /* low ratio < 100: refused */
    printf("%llu %llu %llu\n", (unsigned long long)w.min, (unsigned long long)w.low, (unsigned long long)w.high);
    return 0;
}
C
# shellcheck disable=SC2086 # the flags are words
cc -O2 -Wall -Werror "$work/t.c" $flags -o "$work/t" || fail "cc t.c \$(pkg-config --cflags --libs pagewise)"
out=$(LD_LIBRARY_PATH=$prefix/lib "$work/t") || fail "running t (exit $?)"
# pw_reclaim_watermarks (reclaim.h): min = 12288 / 4, low = min * 240 / 100, high = min * 400 / 100.
[ "$out" = "3072 7372 12288" ] || fail "t printed '$out', expected '3072 7372 12288'"
# (grep -q reads from a here-string, not a pipe: under pipefail, grep -q quitting at its first
# match could kill the writer with SIGPIPE and fail the pipeline.)
grep -q "$prefix/lib/libpagewise.so" <<<"$(LD_LIBRARY_PATH=$prefix/lib ldd "$work/t")" \
    || fail "t is not linked to the installed libpagewise.so"

step "the docs' C examples built with pkg-config, the HPS one run"
# shellcheck disable=SC2086
cc -O2 "$src/examples/c/hps_example.c" $flags -o "$work/hps_example" || fail "cc hps_example.c"
if out=$(LD_LIBRARY_PATH=$prefix/lib "$work/hps_example" 2>&1); then
    grep -q "^promoted [0-9]* regions" <<<"$out" || fail "hps_example printed: $out"
elif grep -q '"present"' <<<"$(grep -A1 '"userfaultfd"' <<<"$("$prefix/bin/pagewise" doctor --json)")"; then
    fail "hps_example failed although userfaultfd is present: $out"
else
    # Counted as a skip by `make test` (see crates/kernel/src/testing.rs).
    reason="running the HPS example needs userfaultfd: $(tail -n1 <<<"$out")"
    echo "skipped: $reason"
    [ -z "${PAGEWISE_SKIP_LOG:-}" ] || echo "test-install.sh::hps_example: $reason" >>"$PAGEWISE_SKIP_LOG"
fi
# The DLM guide's example (compiled only: running it needs two memory servers).
awk '/^cat > dlm_demo.c <<.C.$/ { on = 1; next } /^C$/ { on = 0 } on' "$src/docs/dlm.md" >"$work/dlm_demo.c"
grep -q dlm_init "$work/dlm_demo.c" || fail "no dlm_demo.c in docs/dlm.md"
# shellcheck disable=SC2086
cc -O2 "$work/dlm_demo.c" $flags -o "$work/dlm_demo" || fail "cc dlm_demo.c (docs/dlm.md) \$(pkg-config --cflags --libs pagewise)"
static_flags=$(pkg-config --cflags --libs --static pagewise)
# shellcheck disable=SC2086 # static: the archive, then what it needs (Libs.private)
cc -O2 "$src/examples/c/hps_example.c" $(pkg-config --cflags pagewise) "$prefix/lib/libpagewise.a" \
    ${static_flags#*-lpagewise} -o "$work/hps_example_static" || fail "cc hps_example.c against libpagewise.a"

step "man pages, completions, unit, example config"
for page in pagewise.1 pagewise-doctor.1 pagewise-reclaimd.1 pagewise-reclaim-set.1; do
    [ -s "$prefix/share/man/man1/$page" ] || fail "no man page $page"
done
grep -q -- "--config" <<<"$(MANWIDTH=80 man -l "$prefix/share/man/man1/pagewise-reclaimd.1" 2>/dev/null)" \
    || fail "man pagewise-reclaimd does not render or lacks --config"
bash -c "source '$prefix/share/bash-completion/completions/pagewise' && complete -p pagewise" >/dev/null \
    || fail "bash completion does not load"
[ -s "$prefix/share/zsh/site-functions/_pagewise" ] || fail "no zsh completion"
[ -s "$prefix/share/fish/vendor_completions.d/pagewise.fish" ] || fail "no fish completion"
unit=$prefix/lib/systemd/system/pagewise-reclaimd.service
grep -qx "ExecStart=$prefix/bin/pagewise reclaimd --config /etc/pagewise/reclaimd.toml" "$unit" || fail "unit ExecStart"
if command -v systemd-analyze >/dev/null; then
    # Verify against the installed binary: ExecStart's path must exist, the unit must parse.
    systemd-analyze verify --man=no "$unit" 2>"$work/verify.log" || true
    if grep -q . <<<"$(grep -v "ConditionPathExists\|Failed to .*bus\|No such file or directory.*reclaimd.toml\|^$" "$work/verify.log")"; then
        cat "$work/verify.log" >&2
        fail "systemd-analyze verify $unit"
    fi
fi
example=$prefix/share/doc/pagewise/reclaimd.example.toml
if [ "$(nproc)" -ge 2 ]; then
    "$prefix/bin/pagewise" reclaim show --config "$example" >/dev/null || fail "the example config does not validate"
else
    echo "install test: the example config needs 2 CPUs to validate; this machine has $(nproc)" >&2
fi

step "make uninstall leaves nothing"
minst uninstall PREFIX="$prefix"
[ ! -e "$prefix" ] || { find "$prefix" >&2; fail "left behind under $prefix"; }

step "DESTDIR: a staged install and uninstall"
stage=$work/stage
minst install PREFIX=/usr/local DESTDIR="$stage"
grep -qx "prefix=/usr/local" "$stage/usr/local/lib/pkgconfig/pagewise.pc" || fail "staged .pc names the staging dir"
grep -q "f /usr/local/bin/pagewise" "$stage/usr/local/share/pagewise/install-manifest" || fail "manifest paths"
touch "$stage/usr/local/share/man/man1/not-ours.1"
minst uninstall PREFIX=/usr/local DESTDIR="$stage"
left=$(cd "$stage" && find . -mindepth 1 | sort | tr '\n' ' ')
[ "$left" = "./usr ./usr/local ./usr/local/share ./usr/local/share/man ./usr/local/share/man/man1 ./usr/local/share/man/man1/not-ours.1 " ] \
    || fail "after a staged uninstall with a foreign file, left: $left"

step "an install that fails half-way is undone by uninstall"
fake=$work/fake-target
mkdir "$fake"
cp "$src/target/release/libpagewise.so" "$src/target/release/libpagewise.a" "$fake/"
printf '#!/bin/sh\nexit 3\n' >"$fake/pagewise" # fails when asked to generate the man pages
chmod +x "$fake/pagewise"
if TARGET=$fake PREFIX=$work/half "$here/install.sh" install >"$work/half.log" 2>&1; then
    fail "install.sh succeeded with a binary that cannot generate man pages"
fi
grep -q "f $work/half/lib/libpagewise.so" "$work/half/share/pagewise/install-manifest" || fail "no manifest after a failed install"
PREFIX=$work/half "$here/install.sh" uninstall >/dev/null || fail "uninstall after a failed install"
[ ! -e "$work/half" ] || { find "$work/half" >&2; fail "left behind after a failed install and uninstall"; }

echo "install test: ok"
