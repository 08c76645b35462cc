#!/usr/bin/env bash
# Regenerates bench/prompts/prompts.jsonl from text installed by Debian packages (README.md lists
# the packages and what is taken from each). Nothing in the prompts is written by this project:
# every prompt is a verbatim extract (whitespace of wrapped lines joined, numbering stripped).
#
#   bench/prompts/make_prompts.sh            rewrite prompts.jsonl
#   bench/prompts/make_prompts.sh --check    exit 1 if regenerating would change prompts.jsonl
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/prompts.jsonl"
MODE=${1:-write}
[[ $MODE == write || $MODE == --check ]] || { echo "usage: $0 [--check]" >&2; exit 2; }

TMP=$(mktemp)
trap 'rm -f "$TMP"' EXIT
python3 - "$TMP" <<'PY'
import ast, gzip, json, os, re, subprocess, sys

out_path = sys.argv[1]

def read(path):
    if not os.path.exists(path):
        sys.exit(f"make_prompts: {path} is missing (README.md names its Debian package)")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()

def package_of(path):
    try:
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, check=True)
        return owner.stdout.split(":")[0]
    except (OSError, subprocess.CalledProcessError):
        return "?"

NUMBERING = re.compile(r"^(Q[:.]|\d+(\.\d+)*\.)\s+")

def strip_numbering(line):
    return NUMBERING.sub("", line.strip())

def block(lines, start):
    """The lines from `start` to the next blank line, joined; header underlines dropped."""
    parts = []
    for line in lines[start:]:
        if not line.strip():
            break
        if re.fullmatch(r"\s*[=-]{3,}\s*", line):
            continue
        parts.append(line.strip())
    return " ".join(parts)

def find_last(lines, prefix, path):
    # The last match: a FAQ's table of contents repeats its questions before the answers.
    hits = [i for i, line in enumerate(lines) if strip_numbering(line).startswith(prefix)]
    if not hits:
        sys.exit(f"make_prompts: '{prefix}' not found in {path}")
    return hits[-1]

def question(path, prefix):
    lines = read(path)
    i = find_last(lines, prefix, path)
    text = strip_numbering(block(lines, i))
    return text, f"{package_of(path)}: {path}, the question starting \"{prefix}\""

def paragraph_start(path, prefix, words):
    lines = read(path)
    i = find_last(lines, prefix, path)
    text = " ".join(block(lines, i).split()[:words])
    return text, (f"{package_of(path)}: {path}, the first {words} words of the paragraph "
                  f"starting \"{prefix}\"")

def python_def(path, function):
    read(path)  # exists
    with open(path, encoding="utf-8") as f:
        source = f.read()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
                sys.exit(f"make_prompts: {function} in {path} has no docstring")
            lines = source.splitlines()[node.lineno - 1:doc.end_lineno]
            return "\n".join(lines) + "\n", (
                f"{package_of(path)}: {path}, def {function} through its docstring")
    sys.exit(f"make_prompts: no function {function} in {path}")

XZ = "/usr/share/doc/xz-utils/faq.txt.gz"
ZLIB = "/usr/share/doc/zlib1g-dev/FAQ.gz"
SED = "/usr/share/doc/sed/sedfaq.txt.gz"
PROCPS = "/usr/share/doc/procps/FAQ.gz"
BASE = "/usr/share/doc/base-files/FAQ"
MANDB = "/usr/share/doc/man-db/FAQ"
LICENSES = "/usr/share/common-licenses"
PYTHON_LIB = "/usr/lib/python3.11"  # Debian 12's Python standard library

prompts = []
def add(kind, extracted):
    text, source = extracted
    prompts.append({"id": f"{kind}-{sum(p['id'].startswith(kind) for p in prompts) + 1:02d}",
                    "source": source, "prompt": text})

for path, prefix in [
    (XZ, "What do the letters XZ mean?"),
    (XZ, "What are LZMA and LZMA2?"),
    (XZ, "Can I recover parts of a broken .xz file"),
    (XZ, "How is multi-threaded compression implemented in XZ Utils?"),
    (XZ, "I told xz to use many threads but it is using only one or two"),
    (ZLIB, "Is zlib thread-safe?"),
    (ZLIB, "Ok, so why are there two different formats?"),
    (ZLIB, "Can I access data randomly in a compressed stream?"),
    (ZLIB, "What's the difference between the \"gzip\" and \"deflate\" HTTP 1.1 encodings?"),
    (BASE, "Ok, but how do I know which distribution I'm running?"),
    (PROCPS, "Why do long usernames get printed as numbers?"),
    (PROCPS, "Why does \"ps -aux\" complain about a bogus '-'?"),
    (MANDB, "Why use man-db instead of man?"),
]:
    add("question", question(path, prefix))

for path, prefix in [
    (SED, "How do I perform a case-insensitive search?"),
    (SED, "How do I parse a comma-delimited (CSV) data file?"),
    (SED, "How do I commify a string of numbers?"),
    (SED, "How do I convert a string to all lowercase or capital letters?"),
    (SED, "How do I join two lines if line #1 ends in a [certain string]?"),
    (SED, "How do I insert a newline into the RHS of a substitution?"),
    (ZLIB, "Well that's nice, but how do I make a gzip file in memory?"),
]:
    add("howto", question(path, prefix))

for module, function in [
    ("heapq", "heappush"),
    ("textwrap", "dedent"),
    ("shlex", "quote"),
    ("statistics", "median"),
    ("bisect", "insort_right"),
    ("fnmatch", "fnmatch"),
]:
    add("code", python_def(f"{PYTHON_LIB}/{module}.py", function))

for path, prefix in [
    (f"{LICENSES}/GPL-3", "The licenses for most software and other practical works"),
    (f"{LICENSES}/GFDL-1.3", "The purpose of this License is to make a manual"),
    (f"{LICENSES}/LGPL-2.1", "This license, the Lesser General Public License, applies to some"),
    (f"{LICENSES}/Artistic", "The intent of this document is to state the conditions"),
    (PROCPS, "According to the POSIX and UNIX standards, the above command asks to"),
    (MANDB, "These days, the database is indeed not such an important difference"),
]:
    add("prose", paragraph_start(path, prefix, 40))

with open(out_path, "w", encoding="utf-8") as f:
    for prompt in prompts:
        f.write(json.dumps(prompt, ensure_ascii=False) + "\n")
PY

if [[ $MODE == --check ]]; then
  if ! diff -u "$OUT" "$TMP"; then
    echo "make_prompts: prompts.jsonl differs from what the installed sources give" >&2
    exit 1
  fi
  echo "make_prompts: prompts.jsonl is up to date ($(wc -l <"$OUT") prompts)" >&2
else
  mv "$TMP" "$OUT"
  chmod 0644 "$OUT"
  trap - EXIT
  echo "make_prompts: wrote $OUT ($(wc -l <"$OUT") prompts)" >&2
fi
