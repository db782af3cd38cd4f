#!/usr/bin/env bash
# `make test-asan`: the four native extensions built with AddressSanitizer and UBSan into a
# scratch copy of the package (the in-place .so files of the normal build are left alone),
# then the native differential tests and tests/native (hostile objects) run against that copy
# with libasan preloaded into the (uninstrumented) interpreter. Any sanitizer report fails the
# run (halt_on_error). PYTHONMALLOC=malloc sends every Python object through the sanitizer's
# allocator, so a use-after-free of an object is seen too.
#
#   scripts/asan.sh [pytest args...]    (default: the native test modules, see NATIVE_TESTS)
#   PY=.venv/bin/python  ASAN_KEEP=1 (keep the scratch dir)  CC=gcc
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
CC="${CC:-gcc}"
case "$PY" in /*) ;; *) PY="$ROOT/$PY" ;; esac

LIBASAN="$("$CC" -print-file-name=libasan.so)"
LIBUBSAN="$("$CC" -print-file-name=libubsan.so)"
if [ ! -e "$LIBASAN" ]; then
    echo "asan.sh: $CC has no libasan.so (Debian: apt-get install -y libasan8)" >&2
    exit 2
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/otel-guard-asan.XXXXXX")"
if [ -z "${ASAN_KEEP:-}" ]; then trap 'rm -rf "$WORK"' EXIT; fi

# The package's sources as they are now (other files may move while this runs: copy once).
mkdir -p "$WORK/src"
(cd "$ROOT" && tar --exclude='*.so' --exclude='__pycache__' -cf - guard setup.py pyproject.toml README.md LICENSE 2>/dev/null) |
    tar -xf - -C "$WORK/src"

SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -g -O1"
echo ">> building the native extensions with $SAN into $WORK/src"
(cd "$WORK/src" && CC="$CC" CFLAGS="$SAN -fno-sanitize-recover=undefined" LDFLAGS="-fsanitize=address,undefined" \
    OTEL_GUARD_REQUIRE_NATIVE=1 "$PY" setup.py -q build_ext --inplace -t "$WORK/build" >"$WORK/build.log" 2>&1) || {
    cat "$WORK/build.log" >&2
    echo "asan.sh: the sanitizer build failed" >&2
    exit 2
}

export LD_PRELOAD="$LIBASAN${LIBUBSAN:+:$LIBUBSAN}"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONMALLOC=malloc
export OTEL_GUARD_ASAN=1

# The scratch copy first on sys.path: `python -m` puts the working directory there.
cd "$WORK/src"
"$PY" - <<'EOF'
import importlib, os, sys
for name in ("guard.policy._speedups", "guard.server.decode._otlpnative", "guard.server.applier._applynative",
             "guard.store._rowsnative"):
    m = importlib.import_module(name)
    if not m.__file__.startswith(os.getcwd()):
        sys.exit(f"asan.sh: {name} imported from {m.__file__}, not the sanitizer build")
print(">> sanitizer build imports from", os.getcwd())
EOF

if [ "$#" -eq 0 ]; then
    NATIVE_TESTS=(tests/native)
    for f in $(cd "$ROOT" && grep -rl --include='test_*.py' -e '_speedups' -e '_otlpnative' \
        -e '_applynative' -e '_rowsnative' -e 'native' tests/policy tests/server tests/store | sort); do
        case "$f" in
        tests/server/test_fuzz.py | tests/server/test_pure_python_serve.py) ;; # processes, no native calls of their own
        *) NATIVE_TESTS+=("$f") ;;
        esac
    done
    set -- "${NATIVE_TESTS[@]/#/$ROOT/}"
fi
echo ">> pytest under ASan/UBSan: $*"
# (sanitized code runs several times slower: the per-test timeout is raised to match)
exec "$PY" -m pytest -q -p no:randomly -p no:cacheprovider --rootdir "$ROOT" --timeout 1200 -x "$@"
