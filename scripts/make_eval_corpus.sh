#!/usr/bin/env bash
# Assembles the evaluation corpus of `bitsplit eval` (docs/quality.md) from English prose and
# technical text installed by Debian packages, none of it written by this project: licence
# texts from /usr/share/common-licenses and manual pages rendered by man/groff. It also writes
# a separate CALIBRATION text (for the importance-weighted quantizer configurations) from other
# files, so that no configuration is fitted on the text it is evaluated on.
#
#   scripts/make_eval_corpus.sh [DIR]     (default ~/.cache/bitsplit/eval)
#     DIR/corpus.txt        evaluation text: GPL-3, Apache-2.0, MPL-2.0, gzip(1), grep(1)
#     DIR/calibration.txt   calibration text: GFDL-1.3, sed(1), diff(1), tar(1)
#
# Neither file is committed (they live outside the checkout). File lists and order are fixed;
# a missing source is an error rather than a silently smaller corpus. Man pages are rendered at
# 80 columns without hyphenation or justification, overstrikes removed (col -bx) and the page
# indentation stripped. Exact bytes depend on the installed package versions, so the script
# prints the sha256 of what it wrote; docs/quality.md records the ones measured.
set -euo pipefail

dir="${1:-$HOME/.cache/bitsplit/eval}"
mkdir -p "$dir"
command -v man >/dev/null || { echo "man is not installed" >&2; exit 1; }
command -v col >/dev/null || { echo "col (bsdextrautils) is not installed" >&2; exit 1; }

# assemble OUT "licence ..." "man page ..."
assemble() {
  local out="$1" licences="$2" man_pages="$3" tmp
  tmp="$(mktemp "${out}.XXXXXX")"
  for name in $licences; do
    src="/usr/share/common-licenses/$name"
    [[ -r "$src" ]] || { echo "missing licence text: $src" >&2; rm -f "$tmp"; exit 1; }
    cat "$src" >>"$tmp"
    printf '\n\n' >>"$tmp"
  done
  for page in $man_pages; do
    src="/usr/share/man/man1/$page.1.gz"
    [[ -r "$src" ]] || { echo "missing manual page: $src" >&2; rm -f "$tmp"; exit 1; }
    MANWIDTH=80 man --no-hyphenation --no-justification -E UTF-8 -l "$src" 2>/dev/null |
      col -bx | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | cat -s >>"$tmp"
    printf '\n\n' >>"$tmp"
  done
  mv "$tmp" "$out"
  echo "wrote $out: $(wc -c <"$out") bytes, sha256 $(sha256sum "$out" | cut -d' ' -f1)" >&2
  echo "  from licences: $licences; man pages (section 1): $man_pages" >&2
}

assemble "$dir/corpus.txt" "GPL-3 Apache-2.0 MPL-2.0" "gzip grep"
assemble "$dir/calibration.txt" "GFDL-1.3" "sed diff tar"
