#!/usr/bin/env python3
"""Checks every #include "..." of common/, services/, tools/ and bench/ against the layer order.

    scripts/check_layers.py [ROOT]

A file's layer is its directory two levels deep (common/model, services/coordinator,
tools/bitsplit) or bench for anything under bench/. An include names a layer the same way;
"bitsplit/..." is a generated proto header (layer "proto"); a name without a slash is the
including file's own directory, hence its own layer; any other path is a third-party header and
is not checked. A layer may always include itself. Prints one line per include that RULES does
not allow (file:line: <from layer> may not include <to layer>) and exits 1 if there is any.
Python 3 standard library only.
"""
import fnmatch
import os
import pathlib
import re
import sys

# The allowed graph, as data. Each rule: (layer pattern, layers it may include, reason).
# The first rule whose pattern matches a file's layer applies; a layer no rule matches may
# include only itself. "proto" is the generated protobuf/gRPC code under "bitsplit/".
COMMON_BELOW_MODEL = ["common/ops", "common/quant", "common/io", "common/util"]
RUNTIME = ["common/model", "common/speculation"] + COMMON_BELOW_MODEL
ALL_COMMON = ["common/model", "common/speculation", "common/offline", "common/rpc", "common/cuda",
              "common/text"] + COMMON_BELOW_MODEL
RULES = [
    ("common/util", [],
     "the bottom layer: helpers with no project dependency"),
    ("common/io", ["common/util"],
     "files, mappings and shared memory are built on util alone"),
    ("common/quant", ["common/io", "common/util"],
     "quantized formats are read and written through io"),
    ("common/ops", ["common/quant", "common/io", "common/util"],
     "kernels compute on the quantized blocks of quant"),
    ("common/model", COMMON_BELOW_MODEL,
     "the runtime model composes ops over quantized weights"),
    ("common/speculation", RUNTIME,
     "speculative decoding drives the runtime model's forwards"),
    ("common/text", ["common/io", "common/util"],
     "tokenizer and chat template read GGUF metadata, independent of the model stack"),
    ("common/offline", ["common/model", "common/text"] + COMMON_BELOW_MODEL,
     "quantize, calibrate, allocate and evaluate: the runtime model and the tokenizer, offline"),
    ("common/rpc", ["common/model"] + COMMON_BELOW_MODEL + ["proto"],
     "clients wrap the model layer's interfaces in the generated internal protos"),
    ("common/cuda", RUNTIME,
     "the GPU backend implements the runtime's interfaces with the CPU formats"),
    ("services/*", ["common/model", "common/speculation", "common/rpc", "common/cuda",
                    "common/text", "common/io", "common/util", "proto"],
     "services call the runtime, never quant, ops or the offline side, nor another service"),
    ("tools/*", ALL_COMMON + ["proto"],
     "the command-line tools may use any common layer"),
    ("bench", ALL_COMMON + ["proto"],
     "benchmarks may measure any common layer"),
]

SCANNED = ["common", "services", "tools", "bench"]
PROJECT_ROOTS = {"common", "services", "tools", "tests", "bench"}
SOURCE_SUFFIXES = {".h", ".hh", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer_of(parts):
    """The layer of a repository path given as its components (None: not a project path)."""
    if not parts:
        return None
    if parts[0] == "bitsplit":
        return "proto"
    if parts[0] not in PROJECT_ROOTS:
        return None
    if parts[0] == "bench":
        return "bench"
    if len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0]  # a file directly under common/, services/, tools/ or tests/


def allowed(layer):
    for pattern, targets, _reason in RULES:
        if fnmatch.fnmatchcase(layer, pattern):
            return set(targets)
    return set()


def check_file(root, path):
    rel = path.relative_to(root)
    from_layer = layer_of(rel.parts)
    may = allowed(from_layer) | {from_layer}
    problems = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            name = match.group(1)
            if "/" not in name:
                continue  # the including file's own directory
            to_layer = layer_of(name.split("/"))
            if to_layer is None or to_layer in may:
                continue
            problems.append(f"{rel.as_posix()}:{number}: {from_layer} may not include {to_layer}")
    return problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parent.parent).resolve()
    problems = []
    for top in SCANNED:
        for directory, subdirs, files in os.walk(root / top):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            for name in sorted(files):
                path = pathlib.Path(directory) / name
                if path.suffix in SOURCE_SUFFIXES:
                    problems += check_file(root, path)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layer order", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
