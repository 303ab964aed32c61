#!/usr/bin/env bash
# Builds the library's documentation as a DocC archive (.build/docs/Stitch.doccarchive) with the toolchain's own
# tools — the symbol graph from `swift symbolgraph-extract` (with the modules Stitch re-exports), then `docc convert`
# with its experimental coverage report — and fails if a public symbol of the Stitch library has no doc comment
# (listing each).
#
#   bash scripts/docs.sh            build, report coverage, check
#   bash scripts/docs.sh --preview  the same, then serve it (docc preview) on http://localhost:8080
#
# No DocC plugin is needed (none can be fetched here); `swift package generate-documentation` is that plugin's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"

out=.build/docs
graphs=$out/symbol-graphs
rm -rf "$graphs" "$out/Stitch.doccarchive"
mkdir -p "$graphs"

# The library is five modules — Stitch re-exports the core (StitchCore: engine, storage, manager), the transport
# protocol (StitchTransport) and the backends (StitchURLSession, StitchCurl) — and its documentation is one: the symbol graph of Stitch with the re-exported
# modules' symbols in it. `swift package dump-symbol-graph` cannot ask for those, so the extractor runs here on the
# built modules, with the C modules' maps (the system libraries' in Sources/, the C targets' generated in the build).
swift build --target Stitch >/dev/null 2>&1 || swift build --target Stitch
bin=$(swift build --show-bin-path)
triple=$(swift -print-target-info | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["target"]["triple"])')
maps=()
for map in Sources/C*/module.modulemap "$bin"/C*.build/module.modulemap; do
    if [ -f "$map" ]; then maps+=(-Xcc "-fmodule-map-file=$map"); fi
done
for include in Sources/C*/include; do
    if [ -d "$include" ]; then maps+=(-Xcc "-I$include"); fi
done
reexported=StitchCore,StitchTransport,StitchURLSession,StitchCurl
swift symbolgraph-extract -module-name Stitch -target "$triple" -I "$bin/Modules" "${maps[@]}" \
    -minimum-access-level public -skip-synthesized-members \
    -experimental-allowed-reexported-modules="$reexported" -output-dir "$graphs"

set +e
docc convert Sources/Stitch/Stitch.docc \
    --additional-symbol-graph-dir "$graphs" \
    --fallback-display-name Stitch --fallback-bundle-identifier org.stitch.Stitch \
    --output-path "$out/Stitch.doccarchive" \
    --experimental-documentation-coverage --coverage-summary-level brief \
    --warnings-as-errors 2>&1 | tee "$out/docc.log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
    echo "docs.sh: docc convert failed (exit $status; its warnings are errors here: see above)" >&2
    exit 1
fi

# Every public symbol documented: a symbol with no doc comment of its own, or one inherited only from another
# module (a bare `description` says nothing about this type), is listed.
/usr/bin/python3 - "$graphs" "$reexported" <<'PY'
import glob, json, sys
missing, total = [], 0
for path in sorted(glob.glob(sys.argv[1] + "/*.symbols.json")):
    graph = json.load(open(path))
    for symbol in graph["symbols"]:
        if symbol.get("accessLevel") not in ("public", "open"):
            continue
        # No place in the source (the compiler's Codable init(from:), say): nothing to write a comment on.
        if "location" not in symbol:
            continue
        total += 1
        doc = symbol.get("docComment")
        own = doc and doc.get("lines") and (doc.get("module") in (None, "Stitch", *sys.argv[2].split(",")))
        if not own:
            location = symbol.get("location", {})
            where = location.get("uri", "?").split("/Sources/")[-1]
            line = location.get("position", {}).get("line", -1) + 1
            missing.append(f"{where}:{line}: {symbol['kind']['displayName'].lower()} {'.'.join(symbol['pathComponents'])}")
print(f"docs.sh: {total - len(missing)} of {total} public symbols of Stitch have a doc comment")
if missing:
    print("docs.sh: undocumented public symbols:", *missing, sep="\n  ", file=sys.stderr)
    sys.exit(1)
PY
echo "docs.sh: $out/Stitch.doccarchive"
if [ "${1:-}" = "--preview" ]; then
    docc preview Sources/Stitch/Stitch.docc --additional-symbol-graph-dir "$graphs" \
        --fallback-display-name Stitch --fallback-bundle-identifier org.stitch.Stitch
fi
