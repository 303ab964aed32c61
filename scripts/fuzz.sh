#!/usr/bin/env bash
# Builds the libFuzzer targets in Fuzz/Targets and runs each for a bounded time on its corpus.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]       # default: 60 seconds each, every target
#   scripts/fuzz.sh --build-only [TARGET...]
#   scripts/fuzz.sh --merge [TARGET...]         # shrink each corpus dir to a minimal covering set (see Fuzz/README.md)
#
# Stitch is built once with `-sanitize=fuzzer,address -enable-testing` (its own scratch path, Fuzz/.build, so the
# normal .build is untouched) and each target is linked against its objects, so targets can reach internal parsers
# with `@testable import Stitch`. New inputs a run finds are written to Fuzz/work/<target>/ (not committed); the
# committed seeds in Fuzz/Corpus/<target>/ are only read. A crash or failed invariant stops that target, leaves the
# input under Fuzz/Crashes/<target>/, and the script exits 1 after running the remaining targets.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=run
seconds=60
case ${1:-} in
--build-only) mode=build; shift ;;
--merge) mode=merge; shift ;;
'' | *[!0-9]*) ;;
*) seconds=$1; shift ;;
esac

all=()
for file in Fuzz/Targets/*.swift; do
    name=$(basename "$file" .swift)
    [[ $name == Common ]] || all+=("$name")
done
targets=("${@:-${all[@]}}")
for target in "${targets[@]}"; do
    [[ -f Fuzz/Targets/$target.swift ]] || { echo "fuzz.sh: no target '$target' (have: ${all[*]})" >&2; exit 2; }
done

scratch=Fuzz/.build
build=$scratch/release
bin=$scratch/bin
# StitchRPC builds Stitch too (the RPC layer's JSON reader is a target's subject).
swift build -c release --target StitchRPC --scratch-path "$scratch" \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -enable-testing
mkdir -p "$bin"
# The C modules Stitch's interface mentions, and every object of the library (its C part included).
includes=()
for module in CCurl CCrypto CSQLite CStitchSystem; do includes+=(-I "Sources/$module"); done
includes+=(-Xcc -fmodule-map-file="$build/CStitchCRC.build/module.modulemap" -Xcc -I -Xcc Sources/CStitchCRC/include)
# The library's Swift modules: the umbrella, the core (engine, storage, manager), the transport protocol and both
# backends (Stitch re-exports them), and the lock module every one of them uses.
modules=(Stitch StitchCore StitchTransport StitchURLSession StitchCurl StitchRPC StitchLocks)
objects=("$build"/CStitchCRC.build/*.o)
for module in "${modules[@]}"; do objects+=("$build/$module.build"/*.o); done
pids=()
for target in "${targets[@]}"; do
    # Relink only when the target, the shared helpers or the library changed.
    if [[ -x $bin/$target && $bin/$target -nt Fuzz/Targets/$target.swift && $bin/$target -nt Fuzz/Targets/Common.swift
        && -z $(for module in "${modules[@]}"; do find "$build/$module.build" -name '*.o' -newer "$bin/$target" -print -quit; done) ]]; then
        continue
    fi
    swiftc -O -sanitize=fuzzer,address -use-ld=lld -parse-as-library -module-name "Fuzz$target" \
        Fuzz/Targets/Common.swift "Fuzz/Targets/$target.swift" \
        -I "$build/Modules" "${includes[@]}" "${objects[@]}" -lcurl -lcrypto -lsqlite3 \
        -o "$bin/$target" &
    pids+=($!)
    # Two links at a time: each swiftc with ASan takes over a GiB.
    if ((${#pids[@]} == 2)); then wait "${pids[0]}"; pids=("${pids[1]}"); fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
[[ $mode == build ]] && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
# Without this, Swift's backtracer and ASan fight over a crash and ASan reports a bogus unknown-crash.
export SWIFT_BACKTRACE=${SWIFT_BACKTRACE:-enable=no}
failed=()
for target in "${targets[@]}"; do
    corpus=Fuzz/Corpus/$target
    work=Fuzz/work/$target
    crashes=Fuzz/Crashes/$target
    mkdir -p "$corpus" "$work" "$crashes"
    if [[ $mode == merge ]]; then
        # Minimal set covering what the committed seeds and the last runs' finds reach, back into the corpus.
        # Edge coverage only (-use_counters=0): hit-count buckets would keep several times as many files.
        fresh=$(mktemp -d)
        "$bin/$target" -merge=1 -use_counters=0 -max_len=4096 "$fresh" "$corpus" "$work" 2>&1 |
            grep -E '^MERGE-OUTER: [0-9]+ new' || true
        # Hand-written seeds (and crash inputs) keep their names and are always kept; merged finds are named by
        # their SHA-1.
        for seed in "$corpus"/*; do
            name=$(basename "$seed")
            [[ $name =~ ^[0-9a-f]{40}$ ]] && continue
            rm -f "$fresh/$(sha1sum <"$seed" | cut -c1-40)"
            cp "$seed" "$fresh/$name"
        done
        rm -rf "$corpus" && mv "$fresh" "$corpus" && chmod 755 "$corpus"
        echo "fuzz.sh: $target corpus: $(ls "$corpus" | wc -l) files, $(cat "$corpus"/* | wc -c) bytes"
        continue
    fi
    echo "fuzz.sh: $target for ${seconds}s"
    log=$(mktemp)
    status=0
    # The first directory receives new inputs; the committed corpus is read only.
    "$bin/$target" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$crashes/" "$work" "$corpus" >"$log" 2>&1 || status=$?
    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
    if ((status != 0)); then
        failed+=("$target")
        grep -E -A40 'fuzz invariant failed|ERROR: (libFuzzer|AddressSanitizer)|Fatal error|SUMMARY' "$log" | head -80 || true
        echo "fuzz.sh: $target FAILED (exit $status); input(s) in $crashes:" && ls -1 "$crashes"
    fi
    rm -f "$log"
done
[[ $mode == merge ]] && exit 0
if ((${#failed[@]} > 0)); then
    echo "fuzz.sh: failures in: ${failed[*]}"
    exit 1
fi
echo "fuzz.sh: ${#targets[@]} target(s), ${seconds}s each, no crash"
