#!/usr/bin/env python3
"""A build without CUDA (no nvcc found, or -DATOLL_CUDA=OFF) must still compile.

CI and the development machines have CUDA, so their builds never compile the other branch of
`#if ATOLL_HAVE_CUDA` (a test once used kernels::cuda outside it, and nothing noticed). The
symbols that exist only with CUDA are all named through `cuda::` (kernels/cuda/) or NCCL's names,
so a source can only break that build if it names them. This compiles every such source of the
build directory's compile_commands.json that both kinds of build compile (not kernels/cuda/,
comm/nccl/, the emulator's or NCCL's own targets), and for each such header one source that
includes it, syntax only, as a build without CUDA would: without ATOLL_HAVE_CUDA and
ATOLL_HAVE_NCCL and without the CUDA include directories.

Usage: no_cuda_compile.py BUILD_DIR [SOURCE_DIR]. Exit 0: all compile; 1: one does not (its
errors printed); 77: skipped (no compile_commands.json, or a build without CUDA already).
"""
import json
import os
import re
import shlex
import subprocess
import sys

NAMES = re.compile(r"cuda::|namespace [a-z:]*cuda\b|[Nn]ccl")
CUDA_ONLY_DIRS = ("src/kernels/cuda/", "src/comm/nccl/")
CUDA_ONLY_TARGETS = re.compile(r"_emu|kernels_cuda|nccl", re.IGNORECASE)
# The toolkit's include directory (/usr/local/cuda/include, /usr/local/cuda-13.0/...) and the
# emulator's stand-in headers (src/kernels/cuda/emu/include).
CUDA_INCLUDE = re.compile(r"/cuda(-[0-9.]+)?/|/kernels/cuda/")


def sources(root):
    for top in ("src", "bench", "tests"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".cc", ".h")):
                    path = os.path.relpath(os.path.join(d, f), root)
                    if not path.startswith(CUDA_ONLY_DIRS):
                        yield path


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = sys.argv[1]
    root = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else
                           os.path.join(os.path.dirname(__file__), ".."))
    db_path = os.path.join(build, "compile_commands.json")
    if not os.path.exists(db_path):
        print(f"SKIP: no {db_path}")
        return 77
    db = json.load(open(db_path))
    # One command per source, from a target that both kinds of build have.
    commands = {}
    for e in db:
        path = os.path.relpath(os.path.abspath(os.path.join(e["directory"], e["file"])), root)
        args = shlex.split(e["command"])
        out = args[args.index("-o") + 1] if "-o" in args else ""
        if path.endswith(".cc") and not CUDA_ONLY_TARGETS.search(out):
            commands.setdefault(path, e)
    if not any("-DATOLL_HAVE_CUDA=1" in e["command"] for e in commands.values()):
        print("SKIP: this build has no CUDA; it is the build without CUDA itself")
        return 77
    text = {p: open(os.path.join(root, p)).read() for p in set(sources(root)) | set(commands)}
    named = [p for p in sources(root) if NAMES.search(text[p])]
    check = set(p for p in named if p.endswith(".cc") and p in commands)
    for header in (p for p in named if p.endswith(".h")):
        include = '#include "' + os.path.relpath(header, "src") + '"'
        includers = sorted(p for p in commands if include in text[p])
        if includers:
            check.add(includers[0])
    failed = []
    for path in sorted(check):
        e = commands[path]
        args = shlex.split(e["command"])
        kept, skip = [], False
        for i, a in enumerate(args):
            if skip:
                skip = False
                continue
            if a in ("-o", "-c"):
                skip = a == "-o"
                continue
            if a in ("-I", "-isystem") and CUDA_INCLUDE.search(args[i + 1]):
                skip = True
                continue
            if a.startswith(("-DATOLL_HAVE_CUDA", "-DATOLL_HAVE_NCCL")) or (
                    a.startswith("-I") and CUDA_INCLUDE.search(a)):
                continue
            if os.path.abspath(os.path.join(e["directory"], a)) == os.path.join(root, path):
                continue
            kept.append(a)
        cmd = kept + ["-fsyntax-only", os.path.join(root, path)]
        r = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True)
        print(f"{'ok    ' if r.returncode == 0 else 'FAILED'} {path}")
        if r.returncode != 0:
            failed.append(path)
            print("\n".join(r.stderr.splitlines()[:30]))
    print(f"{len(check) - len(failed)} of {len(check)} sources that name CUDA-only symbols, or "
          f"include a header that does, compile without CUDA")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
