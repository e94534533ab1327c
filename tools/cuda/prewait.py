#!/usr/bin/env python3
"""tools/cuda/prewait.py: the global loads each kernel issues before its
griddepcontrol.wait, read from the SASS. A kernel may read weights and
tables before its wait (written by no kernel); anything an earlier kernel
writes must be read after it. nvcc may move a load through a `const
__restrict__` pointer (ld.global.nc, LDG...CONSTANT in SASS) above the wait
(cuda.cuh, the PDL comment), so after changing a kernel's loads, look here.

    python3 tools/cuda/prewait.py [--arch sm_90a] [--kernel SUBSTR] src/backend/cuda/X.cu ...

Needs nvcc and cuobjdump on PATH (cuobjdump: the CUDA toolkit, or PyPI's
nvidia-cuda-cuobjdump wheel, bin/ inside it). For every kernel with a wait
(ACQBULK) it prints, per wait, the loads between the previous wait (or the
kernel's start) and that wait, in address order: a kernel with two waits on
two paths (k_att_rows: before its loads or after them) lists both. Loads
are LDG (a star marks the non-coherent .CONSTANT ones), LDGSTS (cp.async),
UBLKCP (bulk copies) and UTMALDG (TMA). Address order is not control flow:
read the source next to it.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

LOAD = re.compile(r"\b(LDG|LDGSTS|UBLKCP|UTMALDG)\b[^;]*")


def sass(path, arch):
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path))))
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=" + arch, "-I" + src, "-cubin", "-o", cubin, path], check=True)
        return subprocess.run(["cuobjdump", "-sass", cubin], check=True, capture_output=True, text=True).stdout


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.split("\n")))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def kernels(text):
    """{mangled name: [(address, instruction)]}"""
    out, cur = {}, None
    for ln in text.split("\n"):
        m = re.search(r"Function : (\S+)", ln)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", ln)
        if m and cur is not None:
            cur.append((m.group(1), m.group(2).strip()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    for f in a.files:
        ks = kernels(sass(f, a.arch))
        names = demangle(list(ks))
        for k, ins in ks.items():
            name = names.get(k, k)
            if a.kernel not in name or not any("ACQBULK" in i for _, i in ins):
                continue
            print(f"{os.path.basename(f)}: {name}")
            pending = []
            for addr, i in ins:
                if "ACQBULK" in i:
                    print(f"  wait at {addr}: {len(pending)} loads before it")
                    for pa, pi in pending:
                        print(f"    {'*' if 'CONSTANT' in pi else ' '} {pa}  {pi}")
                    pending = []
                    continue
                m = LOAD.search(i)
                if m:
                    pending.append((addr, re.sub(r"\s+", " ", m.group(0))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
