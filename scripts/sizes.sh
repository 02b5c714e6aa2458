#!/usr/bin/env bash
# Lists what is over the size bars: files in src/ over 500
# lines and functions over 60 lines, each function marked "explained" when a `// Long because`
# comment sits in the lines just above it (its doc comment and attributes).
#
#   scripts/sizes.sh [DIR...]        (default: src)
#
# Test code is exempt from the file bar (tests.rs, *_tests.rs, files under a tests/ folder)
# and from the function bar (those files and `#[cfg(test)] mod` blocks). Function lengths
# assume rustfmt's layout: a function ends at the first `}` at its own indentation. Exits 0;
# it reports, it does not judge.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -eq 0 ] && set -- src
FILE_MAX=${FILE_MAX:-500}
FN_MAX=${FN_MAX:-60}

is_test_file() {
    case "$1" in
    */tests.rs | *_tests.rs | */tests/*) return 0 ;;
    *) return 1 ;;
    esac
}

echo "files over $FILE_MAX lines:"
find "$@" -name '*.rs' -print0 | sort -z | while IFS= read -r -d '' f; do
    is_test_file "$f" && continue
    n=$(wc -l <"$f")
    if [ "$n" -gt "$FILE_MAX" ]; then printf '  %5d  %s\n' "$n" "$f"; fi
done

echo "functions over $FN_MAX lines:"
find "$@" -name '*.rs' -print0 | sort -z | while IFS= read -r -d '' f; do
    is_test_file "$f" && continue
    awk -v file="$f" -v max="$FN_MAX" '
        function indent(s) { match(s, /^ */); return RLENGTH }
        function pad(n,   s) { s = ""; while (n-- > 0) s = s " "; return s }
        # A `#[cfg(test)]` module is skipped up to its closing brace.
        skip_indent >= 0 {
            if ($0 == pad(skip_indent) "}") skip_indent = -1
            next
        }
        /^ *#\[cfg\(test\)\]/ { cfg_test = 1; note = note "\n" $0; next }
        cfg_test && /^ *(pub(\([a-z]+\))? )?mod [A-Za-z0-9_]+ *\{/ {
            cfg_test = 0; skip_indent = indent($0); note = ""; next
        }
        { cfg_test = 0 }
        # What sits above an item: comments and attributes (a "Long because" may be there).
        /^ *(\/\/|#\[)/ { note = note "\n" $0; next }
        /^ *((pub(\([a-z]+\))?|const|async|unsafe|default) )*fn [A-Za-z0-9_]+/ {
            name = $0; sub(/^.*fn /, "", name); sub(/[^A-Za-z0-9_].*$/, "", name)
            top++; fname[top] = name; fstart[top] = NR; findent[top] = indent($0)
            fbody[top] = 0; fwhy[top] = (note ~ /Long because/)
        }
        { note = "" }
        top > 0 && !fbody[top] {
            # Still in the signature: `;` means no body (a trait method), `{` opens it.
            if ($0 ~ /; *$/) { top--; next }
            if ($0 ~ /\{ *$/ || $0 ~ /\} *$/) fbody[top] = 1
            if ($0 ~ /\} *$/ && NR == fstart[top] && $0 ~ /\{/) {
                top--; next
            }
            next
        }
        top > 0 && $0 == pad(findent[top]) "}" {
            len = NR - fstart[top] + 1
            if (len > max)
                printf "  %5d  %s:%d %s%s\n", len, file, fstart[top], fname[top],
                    (fwhy[top] ? "  (explained)" : "")
            top--
        }
        BEGIN { skip_indent = -1; top = 0 }
    ' "$f"
done
